"""The key-value store graphs see as ``store`` (LangGraph's ``BaseStore``), per database URL.

LangGraph's own implementations, not ours: graphs written for the official server call
``runtime.store`` / ``get_store()`` and must find the same semantics (namespaces, filters, TTL)
here. The store shares the runtime's database URL; its tables (``store``, ``store_migrations``)
live beside the checkpointer's and the run stores'.

TTL: the SQLite and PostgreSQL stores are opened with a TTL configuration (reads refresh an item's
TTL by default, expired items are swept every ``SWEEP_INTERVAL_MINUTES``); items without a TTL never
expire. LangGraph's in-memory store has no TTL support, so ``memory://`` refuses ``ttl``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langgraph.store.base import BaseStore, TTLConfig
from langgraph.store.memory import InMemoryStore

from agentkeel.runtime.checkpoints.savers import (
    PG_POOL_MAX_SIZE,
    SQLITE_BUSY_TIMEOUT_MS,
    _sqlite_path,
)

SWEEP_INTERVAL_MINUTES = 5
TTL: TTLConfig = {"refresh_on_read": True, "sweep_interval_minutes": SWEEP_INTERVAL_MINUTES}


@asynccontextmanager
async def open_kv_store(database_url: str) -> AsyncIterator[BaseStore]:
    """Yield a ready (``setup()`` done) store for ``database_url``; close it on exit.

    ``memory://`` → ``InMemoryStore``; ``sqlite:///path`` → ``AsyncSqliteStore``;
    ``postgresql://`` → ``AsyncPostgresStore`` on a connection pool.
    """
    scheme, sep, rest = database_url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {database_url!r}")
    scheme = scheme.lower()
    if scheme == "memory":
        yield InMemoryStore()
    elif scheme in ("sqlite", "sqlite+aiosqlite"):
        async with _open_sqlite(_sqlite_path(database_url, rest)) as store:
            yield store
    elif scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        async with _open_postgres(f"postgresql://{rest}") as store:
            yield store
    else:
        raise ValueError(
            f"unsupported store database scheme {scheme!r} in {database_url!r} "
            "(use memory://, sqlite:///path or postgresql://...)"
        )


@asynccontextmanager
async def _sweeping(store: Any) -> AsyncIterator[None]:
    """Run the store's TTL sweeper for the store's lifetime, and stop its batching task after.

    The SQLite store batches operations in a background task that otherwise lives until the store
    is garbage collected -- after the event loop of a test may already be gone.
    """
    await store.start_ttl_sweeper()
    try:
        yield
    finally:
        await store.stop_ttl_sweeper(timeout=5)
        task = getattr(store, "_task", None)
        if task is not None:
            task.cancel()


@asynccontextmanager
async def _open_sqlite(path: str) -> AsyncIterator[BaseStore]:
    from pathlib import Path

    import aiosqlite
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    async with aiosqlite.connect(path, isolation_level=None) as conn:
        await conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA journal_mode = WAL")
        store = AsyncSqliteStore(conn, ttl=TTL)
        # The class implements TTLs (expiry on write, sweeping) but inherits BaseStore's
        # ``supports_ttl = False`` ahead of its SQLite base's True, so ``aput(ttl=...)`` would refuse.
        store.supports_ttl = True
        await store.setup()
        async with _sweeping(store):
            yield store


@asynccontextmanager
async def _open_postgres(url: str) -> AsyncIterator[BaseStore]:
    from langgraph.store.postgres.aio import AsyncPostgresStore
    from psycopg import AsyncConnection
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[AsyncConnection[dict[str, Any]]] = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=PG_POOL_MAX_SIZE,
        open=False,
        check=AsyncConnectionPool.check_connection,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open(wait=True)
    try:
        store = AsyncPostgresStore(pool, ttl=TTL)
        await store.setup()
        async with _sweeping(store):
            yield store
    finally:
        await pool.close()


__all__ = ["open_kv_store"]
