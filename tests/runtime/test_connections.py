"""The connection layer on a real PostgreSQL: one bounded pool, timeouts, and dead connections replaced.

Connections are counted in ``pg_stat_activity`` by an ``application_name`` unique to the test (set
through the URL, which also shows libpq query parameters reaching the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from runtime_support import (
    FAST,
    Keel,
    backend_matrix,
    new_thread_id,
    run_to_end,
    thread_state,
    wait_until,
)
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentkeel.database import Database, DatabasePool
from agentkeel.runtime.connections import Connections, open_connections
from agentkeel.runtime.kvstore import open_kv_store
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.stores.assistants import AssistantQuery
from agentkeel.runtime.stores.factory import open_stores

POSTGRES = pytest.param(("postgres", "memory"), id="postgres-memory", marks=pytest.mark.postgres)


def _app() -> str:
    return f"keeltest_{uuid.uuid4().hex[:10]}"


async def _backends(admin: psycopg.AsyncConnection, app: str) -> list[int]:
    cursor = await admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))
    return [row[0] for row in await cursor.fetchall()]


@contextlib.asynccontextmanager
async def _admin(pg_url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        yield conn


@contextlib.asynccontextmanager
async def _sampled(admin: psycopg.AsyncConnection, app: str) -> AsyncIterator[list[int]]:
    """Sample the number of the app's backends every few milliseconds while the block runs."""
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(len(await _backends(admin, app)))
            await asyncio.sleep(0.003)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@backend_matrix([POSTGRES])
async def test_runs_state_reads_and_store_calls_share_one_bounded_pool(keel: Keel, pg_url: str) -> None:
    size, app = 3, _app()
    # The module's own database (the one ``keel`` was given), not the session's: a runtime claims
    # every startable run of the database it opens.
    database = f"{keel.backend.database_url}?application_name={app}"
    config = keel.config({"fast": FAST}, database=database, database_pool={"size": size})
    threads = [new_thread_id("pool") for _ in range(6)]

    async with _admin(pg_url) as admin:
        async with keel.open(config) as rt, _sampled(admin, app) as samples:

            async def runs_and_reads(thread_id: str) -> None:
                for _ in range(2):
                    record = await run_to_end(rt, thread_id, "hello")
                    assert record.status is RunStatus.success, record.error
                    await thread_state(rt, thread_id)

            async def store_calls() -> None:
                for i in range(15):
                    await asyncio.gather(
                        rt.kv_store.aput(("pool", app), f"k{i}", {"i": i}),
                        rt.kv_store.asearch(("pool", app)),
                        rt.assistants.search(AssistantQuery()),
                        rt.store.list_threads(),
                        rt.journal.list("no-such-run"),
                    )

            await asyncio.gather(*(runs_and_reads(t) for t in threads), store_calls())
            assert len(await rt.kv_store.asearch(("pool", app), limit=100)) == 15
        print(f"\npool size {size}: max {max(samples)} connections over {len(samples)} samples")
        assert 2 <= max(samples) <= size, samples

        async def none_left() -> bool:
            return await _backends(admin, app) == []

        await wait_until(none_left, timeout=5, what="closing the runtime to close every connection")


@contextlib.asynccontextmanager
async def _connections(pg_url: str, app: str, **pool: object) -> AsyncIterator[Connections]:
    database = Database.parse(f"{pg_url}?application_name={app}", DatabasePool.model_validate(pool))
    async with open_connections(database) as connections:
        yield connections


@pytest.mark.postgres
async def test_a_backend_terminated_while_idle_is_replaced(pg_url: str) -> None:
    app = _app()
    async with _admin(pg_url) as admin, _connections(pg_url, app, size=2) as connections:
        stores = await open_stores(connections)
        async with open_kv_store(connections) as kv:
            thread_id = new_thread_id("terminated")
            await stores.runs.upsert_thread(thread_id, {"k": 1})
            await kv.aput(("terminated",), thread_id, {"v": 1})
            idle = await _backends(admin, app)
            assert idle, "the pool holds no connection"
            for pid in idle:
                await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

            async def all_gone() -> bool:
                return not set(idle) & set(await _backends(admin, app))

            await wait_until(all_gone, timeout=5, what="the terminated backends to exit")
            thread = await stores.runs.get_thread(thread_id)
            assert thread is not None and thread.metadata == {"k": 1}
            item = await kv.aget(("terminated",), thread_id)
            assert item is not None and item.value == {"v": 1}
            assert not set(idle) & set(await _backends(admin, app))  # served by new backends


@pytest.mark.postgres
async def test_checkouts_leave_no_prepared_statements_behind(pg_url: str) -> None:
    async with _connections(pg_url, _app(), size=2) as connections:
        assert connections.pool is not None and connections.sql is not None
        for _ in range(300):
            async with connections.pool.connection():
                pass
            await connections.sql.transaction(lambda c: c.scalar(text("SELECT 1")))
        async with connections.pool.connection() as conn:
            found = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements")).fetchone()
        assert found is not None and found[0] < 10, found


@pytest.mark.postgres
async def test_a_returned_connection_is_back_in_the_pool_at_once_and_reused_without_a_round_trip(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given back, a connection is available before the loop runs anything else (no task hop per
    statement), notes when, and the next checkout reuses it without the liveness round trip."""
    async with _connections(pg_url, _app(), size=2) as connections:
        pool = connections.pool
        assert pool is not None
        async with pool.connection() as conn:
            available = pool.get_stats()["pool_available"]
        assert pool.get_stats()["pool_available"] == available + 1
        assert conn.returned_at is not None  # type: ignore[attr-defined]
        sent: list[str] = []
        execute = type(conn).execute

        async def counting(self: psycopg.AsyncConnection, query: object, *args: object, **kwargs: object) -> object:
            sent.append(str(query))
            return await execute(self, query, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(type(conn), "execute", counting)
        async with pool.connection() as again:
            assert again is conn
        assert sent == []


@pytest.mark.postgres
async def test_a_connection_given_back_mid_transaction_is_rolled_back_into_the_pool_without_its_giver(
    pg_url: str,
) -> None:
    """The rollback a connection given back mid-transaction needs is a round trip; it runs apart
    from whoever gave the connection back (usually a task being cancelled), which is never made
    to wait for it, so cancelling that task cannot cut it short: the connection is rolled back
    and kept, not discarded and replaced."""
    async with _connections(pg_url, _app(), size=2) as connections:
        pool = connections.pool
        assert pool is not None
        opened = pool.get_stats()["connections_num"]
        given_back = asyncio.Event()

        async def user() -> None:
            conn = await pool.getconn()
            await conn.execute("BEGIN")
            await conn.execute("SELECT 1")
            await pool.putconn(conn)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # not waited for
            given_back.set()
            await asyncio.sleep(10)

        task = asyncio.create_task(user())
        await given_back.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        await wait_until(lambda: pool.get_stats()["pool_available"] == opened, timeout=5, what="the connection back")
        stats = pool.get_stats()
        assert stats["connections_num"] == opened and "returns_bad" not in stats, stats
        async with pool.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.postgres
async def test_a_stuck_statement_is_cancelled_by_the_statement_timeout(pg_url: str) -> None:
    async with _connections(pg_url, _app(), size=2, statement_timeout_s=0.2) as connections:
        assert connections.sql is not None and connections.pool is not None

        async def sleep(conn: AsyncConnection) -> object:
            return await conn.scalar(text("SELECT pg_sleep(2)"))

        with pytest.raises(OperationalError, match="statement timeout"):
            await connections.sql.transaction(sleep)
        async with connections.pool.connection() as conn:
            with pytest.raises(psycopg.errors.QueryCanceled):
                await conn.execute("SELECT pg_sleep(2)")
        async with connections.unbounded() as conn:  # LangGraph's setup() runs without it
            assert await (await conn.execute("SHOW statement_timeout")).fetchone() == ("0",)
        async with connections.pool.connection() as conn:  # and gives it back afterwards
            assert await (await conn.execute("SHOW statement_timeout")).fetchone() == ("200ms",)
        assert await connections.sql.transaction(lambda c: c.scalar(text("SELECT 1"))) == 1


@pytest.mark.postgres
async def test_url_options_win_over_the_pool_defaults(pg_url: str) -> None:
    url = f"{pg_url}?options=-c%20statement_timeout%3D1234&connect_timeout=7"
    async with open_connections(Database.parse(url)) as connections:
        assert connections.pool is not None
        async with connections.pool.connection() as conn:
            assert await (await conn.execute("SHOW statement_timeout")).fetchone() == ("1234ms",)
            assert conn.info.get_parameters()["connect_timeout"] == "7"
            assert (await (await conn.execute("SHOW application_name")).fetchone()) == ("agentkeel",)


@pytest.mark.postgres
async def test_the_stores_get_transactions_and_langgraph_gets_autocommit_from_one_pool(pg_url: str) -> None:
    async with _connections(pg_url, _app(), size=2) as connections:
        assert connections.sql is not None and connections.pool is not None
        await (await open_stores(connections)).runs.list_threads()  # migrated
        thread_id = new_thread_id("rolled-back")

        async def insert_then_fail(conn: AsyncConnection) -> None:
            await conn.execute(
                text("INSERT INTO threads (thread_id, metadata, status, created_at, updated_at) "
                     "VALUES (:t, '{}', 'idle', now(), now())"),
                {"t": thread_id},
            )
            raise RuntimeError("abort the transaction")

        for _ in range(3):  # the same connections go back and forth between the two users
            with pytest.raises(RuntimeError):
                await connections.sql.transaction(insert_then_fail)
            async with connections.pool.connection() as conn:
                assert conn.autocommit
                found = await conn.execute("SELECT count(*) FROM threads WHERE thread_id = %s", (thread_id,))
                assert await found.fetchone() == (0,)


@pytest.mark.postgres
async def test_a_server_notice_is_logged_once_however_often_the_engine_took_the_connection(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with _connections(pg_url, _app(), size=2) as connections:
        assert connections.sql is not None
        async def one(conn: AsyncConnection) -> object:
            return await conn.scalar(text("SELECT 1"))

        await asyncio.gather(*(connections.sql.transaction(one) for _ in range(20)))
        marker = f"keel-notice-{uuid.uuid4().hex[:6]}"
        with caplog.at_level(logging.INFO, logger="sqlalchemy.dialects.postgresql"):
            await connections.sql.transaction(
                lambda c: c.execute(text(f"DO $$ BEGIN RAISE NOTICE '{marker}'; END $$"))
            )
        assert sum(marker in r.getMessage() for r in caplog.records) == 1


async def test_sqlite_stores_share_one_engine_bounded_by_the_pool_size(tmp_path: Path) -> None:
    database = Database.parse(f"sqlite:///{tmp_path / 'keel.db'}", DatabasePool(size=3))
    async with open_connections(database) as connections:
        assert connections.sql is not None and connections.pool is None
        pool = connections.sql.engine.pool
        assert pool.size() == 3  # type: ignore[attr-defined]
        stores = await open_stores(connections)
        await asyncio.gather(*(stores.assistants.count(AssistantQuery()) for _ in range(10)),
                             *(stores.runs.list_threads() for _ in range(10)))
        assert pool.checkedin() <= 3  # type: ignore[attr-defined]
