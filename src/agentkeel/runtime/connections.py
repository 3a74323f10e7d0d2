"""The connection layer: one pool per database per process, shared by everything that persists.

``open_connections(config.db)`` is the only place a process connects to its ``database``; the run,
journal and assistant stores, LangGraph's checkpointer and its key-value store all draw from what it
opens, so ``database_pool.size`` bounds the connections a process holds.

* **PostgreSQL** -- one psycopg ``AsyncConnectionPool``. LangGraph's PostgreSQL saver (as
  ``PooledPostgresSaver``: a connection per call) and ``AsyncPostgresStore`` take the pool itself; the stores' SQLAlchemy engine has no pool of its own
  (``NullPool``) and takes each connection from this one (``async_creator``), and closing it hands
  the connection back (``close_returns``). Pooled connections are in autocommit, which LangGraph
  needs (its ``setup()`` runs ``CREATE INDEX CONCURRENTLY`` and each call is its own unit of work;
  its cursors ask for ``dict_row`` themselves), and they stay in it with the stores too: the
  stores' transactions (``SELECT ... FOR UPDATE`` locks a thread until commit) are opened by an
  explicit ``BEGIN`` (``stores/sql_engine.py``), so a connection passes between the two users
  with nothing to switch. ``prepare_threshold=0`` is what LangGraph documents for its connections.

  Every connection gets a connect timeout, TCP keepalives with a matching ``tcp_user_timeout``, and
  a server-side ``statement_timeout``, so a half-open connection or a stuck backend fails a call
  within a bound instead of hanging it (and shutdown with it); and each checkout is checked, so a
  connection that died while idle (a restarted server, ``pg_terminate_backend``, a NAT timeout) is
  replaced rather than failing the next call (for free when it was used within the last second,
  with a round trip after longer idleness: ``_alive``). Migrations lift the statement timeout for themselves
  (an index build on a large table may legitimately take longer). URL query parameters win over
  these defaults.
* **SQLite** -- one SQLAlchemy engine for the three stores, its pool bounded by the same size, on
  connections that run on the event loop's thread (``sqlite_inline.py``: a statement never waits
  for a lock there, so it never blocks the loop). LangGraph's SQLite saver and store take a single
  connection rather than a pool: the saver keeps an inline one of its own
  (``checkpoints/sqlite_saver.py``), the store an aiosqlite connection with its thread to the same
  file (``sqlite_connection``).
* **memory://** -- nothing to open.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from agentkeel.database import Database, DatabasePool
from agentkeel.runtime.sqlite_inline import InlineConnection, connect_inline
from agentkeel.runtime.startup import StartupError
from agentkeel.runtime.stores.sql_engine import SqlDatabase
from agentkeel.runtime.wal_checkpointer import WalCheckpointer

APPLICATION_NAME = "agentkeel"  # what pg_stat_activity shows, unless the URL names another
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3
# LangGraph's SQLite saver and store do not retry a busy database, so they wait longer than the stores.
LANGGRAPH_SQLITE_BUSY_TIMEOUT_MS = 30_000
POOL_CLOSE_TIMEOUT_S = 5.0
# A connection idle in the pool longer than this is checked with a round trip before reuse.
IDLE_CHECK_S = 1.0
# A connection given back in these states needs a rollback or a close before the pool can reuse it.
_UNFINISHED = (TransactionStatus.INTRANS, TransactionStatus.INERROR, TransactionStatus.ACTIVE)


class PooledConnection(AsyncConnection[TupleRow]):
    """A pool connection that SQLAlchemy may take many times.

    SQLAlchemy's psycopg dialect adds its notice logger whenever it connects, and with ``NullPool``
    every checkout is a connect: without this, one connection would collect a handler per checkout.
    """

    returned_at: float | None = None  # time.monotonic() when last given back to the pool

    def add_notice_handler(self, callback: Any) -> None:
        with contextlib.suppress(ValueError):
            self.remove_notice_handler(callback)
        super().add_notice_handler(callback)


class Pool(AsyncConnectionPool[Any]):
    """The process's pool: a returned connection notes when (``_alive`` reads it).

    Why here and not in the pool's ``reset`` callback: with a ``reset`` set, psycopg_pool hands
    every returned connection to a background worker task, so each statement paid an extra task
    and loop wake-up, and the connection was back in the pool only a loop iteration later. Noting
    the time needs no round trip, so it is done inline, and an idle connection goes straight back.

    A connection given back inside a transaction or a statement (an error or a cancellation cut
    its user short) needs a rollback or a close first, a round trip: that return is handed to a
    task of its own and not waited for, as the ``reset`` task did it. Done inline, the round trip
    would run in whoever gives the connection back, usually a task being cancelled: cancelled
    again during it, psycopg_pool swallows the cancellation and discards the connection; and a
    caller that saw the cancellation and closed the connection again would return it a second
    time while the first return is still rolling it back.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._returning: set[asyncio.Task[None]] = set()
        # Why the pool could not connect, last time it tried: psycopg_pool only logs it, and its
        # own timeout says nothing of the cause ("pool initialization incomplete").
        self.connect_error: Exception | None = None

    async def _connect(self, timeout: float | None = None) -> AsyncConnection[Any]:
        try:
            return await super()._connect(timeout)
        except Exception as exc:
            self.connect_error = exc
            raise

    async def putconn(self, conn: AsyncConnection[Any]) -> None:
        if isinstance(conn, PooledConnection):
            conn.returned_at = time.monotonic()
        if conn.pgconn.transaction_status in _UNFINISHED:
            task = asyncio.get_running_loop().create_task(super().putconn(conn), name="agentkeel-pool-return")
            self._returning.add(task)
            task.add_done_callback(self._returning.discard)
        else:
            await super().putconn(conn)

    async def close(self, timeout: float = 5.0) -> None:
        """Close after the returns still rolling back, so none outlives the pool."""
        await asyncio.gather(*self._returning, return_exceptions=True)
        await super().close(timeout)


def postgres_conninfo(url: str, pool: DatabasePool) -> str:
    """The libpq connection string: the pool's timeouts and keepalives, then the URL's own values."""
    given = conninfo_to_dict(url)
    params: dict[str, Any] = {
        "application_name": APPLICATION_NAME,
        "connect_timeout": pool.connect_timeout_s,
        "keepalives": 1,
        "keepalives_idle": pool.keepalive_idle_s,
        "keepalives_interval": KEEPALIVE_INTERVAL_S,
        "keepalives_count": KEEPALIVE_PROBES,
        # Keepalives only probe an idle socket; this bounds a write the peer never acknowledges.
        "tcp_user_timeout": (pool.keepalive_idle_s + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES) * 1000,
        **given,
    }
    # libpq applies ``-c`` settings in order, so the URL's own options come last and win.
    options = f"-c statement_timeout={round(pool.statement_timeout_s * 1000)}"
    params["options"] = f"{options} {given['options']}" if given.get("options") else options
    return make_conninfo("", **params)


async def _alive(conn: AsyncConnection[Any]) -> None:
    """The pool's ``check``, before a connection is handed out: one round trip (which raises on a
    dead connection, so the pool replaces it) when it is needed.

    An idle pooled connection has nothing to read; a terminated backend or a restarted server
    leaves an error and EOF on its socket, so a readable socket (a zero-timeout ``select``, no
    round trip) means "check it". So does more than ``IDLE_CHECK_S`` in the pool: a silently
    dropped path (a NAT timeout) leaves nothing to read. A busy process reuses its connections
    within milliseconds, so its store calls pay no extra round trip. The round trip is never
    prepared: under ``prepare_threshold=0`` psycopg would prepare the empty query anew on every
    check and leave one server-side statement behind per checkout.
    """
    returned = getattr(conn, "returned_at", None)
    idle_long = returned is None or time.monotonic() - returned > IDLE_CHECK_S
    if idle_long or conn.closed or select.select([conn.fileno()], [], [], 0)[0]:
        await conn.execute("", prepare=False)


@dataclass
class Connections:
    """What ``open_connections`` opened. ``sql`` is None for ``memory://``; ``pool`` is set for
    PostgreSQL only (LangGraph's PostgreSQL saver and store use it directly)."""

    database: Database
    sql: SqlDatabase | None = None
    pool: Pool | None = None
    conninfo: str = ""  # PostgreSQL: for a connection that must live outside the pool (LISTEN)

    @contextlib.asynccontextmanager
    async def unbounded(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pool connection without the statement timeout, for LangGraph's ``setup()``."""
        assert self.pool is not None, "PostgreSQL only"
        async with self.pool.connection() as conn:
            await conn.execute("SET statement_timeout = 0")
            try:
                yield conn
            finally:
                if not conn.closed:
                    await conn.execute("RESET statement_timeout")  # back to the connection's -c value


@contextlib.asynccontextmanager
async def open_connections(database: Database) -> AsyncIterator[Connections]:
    """Open the pool (or engine) of ``database``; close it on exit, after its users closed."""
    url = database.url
    if url.backend == "memory":
        yield Connections(database)
        return
    if url.backend == "sqlite":
        path = Path(url.target).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            probe = await connect_inline(path)  # the file opens and is a database, or start-up says why
            try:
                await probe.execute("SELECT count(*) FROM sqlite_master")
            finally:
                await probe.close()
        except (OSError, sqlite3.Error) as exc:
            raise StartupError("database", f"cannot open {url}: {exc}") from None
        engine = _sqlite_engine(path, database.pool)
        checkpointer = WalCheckpointer(path)
        checkpointer.start()
        try:
            yield Connections(database, sql=SqlDatabase(engine))
        finally:
            await engine.dispose()
            await asyncio.to_thread(checkpointer.stop)
        return
    conninfo = postgres_conninfo(url.target, database.pool)
    pool = _postgres_pool(conninfo, database.pool)
    try:
        await pool.open(wait=True, timeout=database.pool.acquire_timeout_s)
    except PoolTimeout:  # the pool is closed by then
        cause = pool.connect_error or "no connection was made"
        raise StartupError(
            "database", f"no connection to {url} within {database.pool.acquire_timeout_s:g} s "
            f"(database_pool.acquire_timeout_s): {cause}",
        ) from None
    try:
        engine = _postgres_engine(pool, database.pool)
        try:
            yield Connections(database, sql=SqlDatabase(engine), pool=pool, conninfo=conninfo)
        finally:
            await engine.dispose()
    finally:
        await pool.close(timeout=POOL_CLOSE_TIMEOUT_S)


def _postgres_pool(conninfo: str, settings: DatabasePool) -> Pool:
    return Pool(
        conninfo,
        connection_class=PooledConnection,
        kwargs={"autocommit": True, "prepare_threshold": 0},
        min_size=1,
        max_size=settings.size,
        timeout=settings.acquire_timeout_s,
        check=_alive,
        close_returns=True,
        name=APPLICATION_NAME,
        open=False,
    )


def _postgres_engine(pool: Pool, settings: DatabasePool) -> AsyncEngine:
    async def checkout() -> AsyncConnection[Any]:
        return await pool.getconn(timeout=settings.acquire_timeout_s)

    return create_async_engine("postgresql+psycopg://", async_creator=checkout, poolclass=NullPool)


def _sqlite_engine(path: Path, settings: DatabasePool) -> AsyncEngine:
    async def connect() -> InlineConnection:
        return await connect_inline(path)

    return create_async_engine(
        URL.create("sqlite+aiosqlite", database=str(path)),
        async_creator=connect,
        pool_size=settings.size,
        max_overflow=0,
        pool_timeout=settings.acquire_timeout_s,
    )


@contextlib.asynccontextmanager
async def sqlite_connection(connections: Connections, **connect_kwargs: Any) -> AsyncIterator[Any]:
    """An aiosqlite connection to the SQLite database, for LangGraph's key-value store.

    WAL, so readers (the gateway reading state) never block a run writing checkpoints; a busy
    timeout, because the stores write to the same file from their own connections; and
    ``synchronous=NORMAL``, which under WAL survives a process crash (only power loss can drop the
    last commits) -- the durability the stores use -- where FULL costs ~5 ms a step.
    """
    import aiosqlite

    path = Path(connections.database.url.target)
    path.parent.mkdir(parents=True, exist_ok=True)
    async with aiosqlite.connect(path, **connect_kwargs) as conn:
        await conn.execute(f"PRAGMA busy_timeout = {LANGGRAPH_SQLITE_BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA synchronous = NORMAL")
        yield conn
