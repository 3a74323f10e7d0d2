"""What only the SQL stores have: migrations, the database-enforced invariants, SQLite's locking, and
how they write (appends of many runs group-committed, SQLite lock waits off the event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, event, inspect, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentkeel.database import Database
from agentkeel.runtime import sqlite_inline
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.records import MultitaskStrategy, RunRecord, new_run_id
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.stores.factory import open_stores
from agentkeel.runtime.stores.memory import MemoryRunStore
from agentkeel.runtime.stores.sql import SqlRunStore
from agentkeel.runtime.stores.sql_engine import SqlDatabase
from agentkeel.runtime.stores.sql_journal import SqlJournalStore
from agentkeel.runtime.stores.sql_schema import metadata


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each SQL dialect."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keel.db"
    return str(request.getfixturevalue("fresh_pg_url"))


@contextlib.asynccontextmanager
async def sql_database(url: str) -> AsyncIterator[SqlDatabase]:
    """The stores' database on a connection layer of its own (as another process would have)."""
    async with open_connections(Database.parse(url)) as connections:
        assert connections.sql is not None
        yield connections.sql


@pytest.fixture
async def db(sql_url: str) -> AsyncIterator[SqlDatabase]:
    async with sql_database(sql_url) as database:
        await database.setup()
        yield database


async def scalar(db: SqlDatabase, sql: str, **params: object) -> object:
    async def work(conn: AsyncConnection) -> object:
        return await conn.scalar(text(sql), params)

    return await db.transaction(work)


def _schema_diff(conn: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(conn), metadata))


def _indexes(conn: Connection) -> dict[str, bool]:
    return {str(ix["name"]): bool(ix["unique"]) for ix in inspect(conn).get_indexes("runs")}


# -- migrations --------------------------------------------------------------------------------
async def test_fresh_database_gets_the_schema_of_sql_schema(db: SqlDatabase) -> None:
    assert await scalar(db, "SELECT version_num FROM alembic_version") == "0005"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_schema_diff) == []
        indexes = await conn.run_sync(_indexes)
    assert indexes == {
        "ix_runs_thread_status": False,
        "ix_runs_status_lease": False,
        "uq_runs_thread_queue_seq": True,
        "uq_runs_thread_running": True,
    }


async def test_setup_twice_is_a_no_op_and_keeps_data(db: SqlDatabase, sql_url: str) -> None:
    store = SqlRunStore(db)
    await store.upsert_thread("kept", {"k": 1})
    await db.setup()
    async with sql_database(sql_url) as again:
        await again.setup()
        assert (await SqlRunStore(again).get_thread("kept")) == await store.get_thread("kept")
    assert await scalar(db, "SELECT count(*) FROM alembic_version") == 1


async def test_concurrent_setup_of_one_database(sql_url: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        databases = [await stack.enter_async_context(sql_database(sql_url)) for _ in range(4)]
        await asyncio.gather(*(d.setup() for d in databases))
        assert await scalar(databases[0], "SELECT version_num FROM alembic_version") == "0005"


# -- invariants the database enforces ------------------------------------------------------------
async def test_unique_index_refuses_a_second_running_run_behind_the_stores_back(
    db: SqlDatabase,
) -> None:
    store = SqlRunStore(db)
    first = RunRecord(new_run_id(), "t", "lead")
    second = RunRecord(new_run_id(), "t", "lead", multitask_strategy=MultitaskStrategy.enqueue)
    await store.admit(first)
    await store.admit(second)
    await store.mark_running(first.run_id, 1, "w", None)

    async def bypass(conn: AsyncConnection) -> None:
        await conn.execute(
            text("UPDATE runs SET status = 'running' WHERE run_id = :id"), {"id": second.run_id}
        )

    with pytest.raises(IntegrityError):
        await db.transaction(bypass)
    assert await scalar(db, "SELECT count(*) FROM runs WHERE status = 'running'") == 1
    # ... while any number of pending runs per thread is fine.
    assert await scalar(db, "SELECT count(*) FROM runs WHERE status = 'pending'") == 1


async def test_unknown_status_is_refused_by_the_database(db: SqlDatabase) -> None:
    store = SqlRunStore(db)
    record = RunRecord(new_run_id(), "t", "lead")
    await store.admit(record)

    async def bypass(conn: AsyncConnection) -> None:
        await conn.execute(
            text("UPDATE runs SET status = 'paused' WHERE run_id = :id"), {"id": record.run_id}
        )

    with pytest.raises(IntegrityError):
        await db.transaction(bypass)


# -- SQLite locking ----------------------------------------------------------------------------
def _try_write_lock(path: Path) -> bool:
    """Whether another connection can take the write lock right now (without waiting)."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc)
        return False
    finally:
        conn.close()


async def test_sqlite_writes_begin_immediate_and_reads_do_not(tmp_path: Path) -> None:
    path = tmp_path / "keel.db"
    async with sql_database(f"sqlite:///{path}") as db:
        await db.setup()

        async def probe(conn: AsyncConnection) -> bool:
            await conn.execute(text("SELECT 1"))  # a transaction that has only read so far
            return await asyncio.to_thread(_try_write_lock, path)

        assert await db.transaction(probe) is False  # the write lock was taken at BEGIN
        assert await db.transaction(probe, read_only=True) is True
        assert await scalar(db, "PRAGMA journal_mode") == "wal"
        assert await scalar(db, "PRAGMA foreign_keys") == 1


async def test_a_sqlite_store_call_never_hands_the_loop_to_another_task(tmp_path: Path) -> None:
    """An inline SQLite transaction runs start to close in one turn of the loop: no other task
    runs in between (and, for a write, none waits behind this process's writer queue meanwhile).
    SQLAlchemy's own ``async with engine.connect()`` closed in a task of its own: two turns."""
    async with sql_database(f"sqlite:///{tmp_path / 'keel.db'}") as db:
        await db.setup()
        store, journal = SqlRunStore(db), SqlJournalStore(db)
        await store.upsert_thread("t")
        calls = {
            "a read": lambda: store.get("no-such-run"),
            "a one-statement write": lambda: store.set_thread_status("t", "idle"),
            "a transaction": lambda: store.admit(RunRecord(run_id=new_run_id(), thread_id="t", assistant_id="lead",
                                                           multitask_strategy=MultitaskStrategy.enqueue)),
            "a journal read": lambda: journal.list("no-such-run"),
        }
        for what, call in calls.items():
            others: list[str] = []
            asyncio.get_running_loop().call_soon(others.append, what)
            await call()
            assert others == [], f"another task ran during {what}"


def _hold_write_lock(path: Path, seconds: float, held: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    held.set()
    threading.Event().wait(seconds)
    conn.execute("ROLLBACK")
    conn.close()


@pytest.mark.parametrize(("hold_s", "succeeds"), [(0.1, True), (1.5, False)])
async def test_sqlite_busy_is_retried_with_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold_s: float, succeeds: bool
) -> None:
    monkeypatch.setattr(sqlite_inline, "SQLITE_BUSY_TIMEOUT_MS", 20)
    monkeypatch.setattr(sqlite_inline, "BUSY_BACKOFF_S", (0.02, 0.1))
    path = tmp_path / "keel.db"
    async with sql_database(f"sqlite:///{path}") as db:
        await db.setup()
        held = threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(path, hold_s, held))
        holder.start()
        try:
            await asyncio.to_thread(held.wait)
            store = SqlRunStore(db)
            if succeeds:
                assert (await store.upsert_thread("t")).thread_id == "t"
            else:
                with pytest.raises(OperationalError, match="locked"):
                    await store.upsert_thread("t")
        finally:
            await asyncio.to_thread(holder.join)


async def test_open_stores_creates_the_sqlite_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "keel.db"
    async with open_connections(Database.parse(f"sqlite:///{path}")) as connections:
        run_store = (await open_stores(connections)).runs
        assert path.exists()
        assert await run_store.list_threads() == []
    async with open_connections(Database.parse("memory://")) as connections:
        assert isinstance((await open_stores(connections)).runs, MemoryRunStore)


def _event(run_id: str, seq: int, data: dict[str, Any] | None = None) -> JournalEvent:
    return JournalEvent(run_id, f"thread-{run_id}", seq, "model.call", data if data is not None else {"n": seq})


@pytest.fixture
async def inserts(db: SqlDatabase) -> AsyncIterator[list[int]]:
    """The rows of every INSERT into the journal the database receives, per execution (an
    ``executemany`` is one execution of all its rows)."""
    seen: list[int] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO JOURNAL"):
            seen.append(len(parameters) if executemany else 1)

    event.listen(db.engine.sync_engine, "before_cursor_execute", record)
    yield seen
    event.remove(db.engine.sync_engine, "before_cursor_execute", record)


@contextlib.asynccontextmanager
async def _journal_locked(url: str, dialect: str) -> AsyncIterator[None]:
    """Another connection holds the journal's write lock until the block ends."""
    if dialect == "sqlite":
        path = url.removeprefix("sqlite:///")
        release, held = threading.Event(), threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            held.set()
            release.wait()
            conn.execute("ROLLBACK")
            conn.close()

        holder = threading.Thread(target=hold)
        holder.start()
        await asyncio.to_thread(held.wait)
        try:
            yield
        finally:
            release.set()
            await asyncio.to_thread(holder.join)
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("LOCK TABLE journal IN EXCLUSIVE MODE")
        yield
        await conn.rollback()


async def _in_flight(journal: SqlJournalStore) -> None:
    while journal._writing is None:  # the leader's write is waiting for the lock
        await asyncio.sleep(0.005)


async def test_appends_arriving_while_a_write_is_in_flight_are_one_write(
    db: SqlDatabase, sql_url: str, inserts: list[int]
) -> None:
    journal = SqlJournalStore(db)
    async with _journal_locked(sql_url, db.dialect):
        leader = asyncio.create_task(journal.append([_event("leader", 1)]))
        await _in_flight(journal)
        joined = [asyncio.create_task(journal.append([_event(f"run-{i}", 1), _event(f"run-{i}", 2)])) for i in range(10)]
        await asyncio.sleep(0)
    await asyncio.gather(leader, *joined)
    # The leader's one row (its statement retried while the lock was held, on SQLite), then the
    # other ten runs' twenty rows in one execution.
    assert set(inserts) == {1, 20} and inserts.count(20) == 1, inserts
    assert [e.seq for e in await journal.list("leader")] == [1]
    for i in range(10):
        assert [e.seq for e in await journal.list(f"run-{i}")] == [1, 2]


async def test_a_failing_append_fails_only_its_own_caller(db: SqlDatabase, sql_url: str) -> None:
    journal = SqlJournalStore(db)
    unstorable = {"value": {1, 2}}  # a set: the JSON column refuses it
    async with _journal_locked(sql_url, db.dialect):
        leader = asyncio.create_task(journal.append([_event("leader", 1)]))
        await _in_flight(journal)
        group = asyncio.gather(
            journal.append([_event("good-1", 1)]),
            journal.append([_event("bad", 1, unstorable)]),
            journal.append([_event("good-2", 1)]),
            return_exceptions=True,
        )
        await asyncio.sleep(0)
    await leader
    results = await group
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Exception)
    for run_id in ("leader", "good-1", "good-2"):
        assert [e.seq for e in await journal.list(run_id)] == [1]
    assert await journal.list("bad") == []


async def test_a_cancelled_appender_does_not_cancel_the_others(db: SqlDatabase) -> None:
    journal = SqlJournalStore(db)
    first = asyncio.create_task(journal.append([_event("cancelled", 1)]))
    second = asyncio.create_task(journal.append([_event("kept", 1)]))
    await asyncio.sleep(0)
    first.cancel()
    await second
    assert [e.seq for e in await journal.list("kept")] == [1]


async def test_waiting_for_another_connections_sqlite_lock_does_not_hold_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "keel.db"
    async with sql_database(f"sqlite:///{path}") as db:
        await db.setup()
        held = threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(path, 0.5, held))
        holder.start()
        try:
            await asyncio.to_thread(held.wait)
            ticks = 0
            write = asyncio.create_task(SqlRunStore(db).upsert_thread("t"))
            while not write.done():  # the loop keeps running other tasks while the write waits
                ticks += 1
                await asyncio.sleep(0.01)
            assert (await write).thread_id == "t"
            assert ticks > 1
        finally:
            await asyncio.to_thread(holder.join)
