"""The key-value store graphs see as ``store`` (LangGraph's ``BaseStore``), per database URL.

LangGraph's own implementations, not ours: graphs written for the official server call
``runtime.store`` / ``get_store()`` and must find the same semantics (namespaces, filters, TTL)
here. The store shares the runtime's database; its tables (``store``, ``store_migrations``) live
beside the checkpointer's and the run stores'. On PostgreSQL it uses the one pool of
``runtime/connections.py``; on SQLite it keeps its own aiosqlite connection.

TTL: the SQLite and PostgreSQL stores are opened with a TTL configuration (reads refresh an item's
TTL by default, expired items are swept every ``SWEEP_INTERVAL_MINUTES``); items without a TTL never
expire. LangGraph's in-memory store has no TTL support, so ``memory://`` refuses ``ttl``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore, TTLConfig
from langgraph.store.memory import InMemoryStore

from agentkeel.runtime.connections import Connections, sqlite_connection
from agentkeel.runtime.langgraph_setup import serialized_setup, serialized_sqlite_setup

SWEEP_INTERVAL_MINUTES = 5
TTL: TTLConfig = {"refresh_on_read": True, "sweep_interval_minutes": SWEEP_INTERVAL_MINUTES}


@asynccontextmanager
async def open_kv_store(connections: Connections) -> AsyncIterator[BaseStore]:
    """Yield a ready (``setup()`` done) store for ``connections``' database; close it on exit.

    ``memory://`` → ``InMemoryStore``; SQLite → ``AsyncSqliteStore``; PostgreSQL →
    ``AsyncPostgresStore`` on the shared pool.
    """
    backend = connections.database.url.backend
    if backend == "memory":
        yield InMemoryStore()
    elif backend == "sqlite":
        async with _open_sqlite(connections) as store:
            yield store
    else:
        async with _open_postgres(connections) as store:
            yield store


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
async def _open_sqlite(connections: Connections) -> AsyncIterator[BaseStore]:
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    async with sqlite_connection(connections, isolation_level=None) as conn:
        store = AsyncSqliteStore(conn, ttl=TTL)
        # The class implements TTLs (expiry on write, sweeping) but inherits BaseStore's
        # ``supports_ttl = False`` ahead of its SQLite base's True, so ``aput(ttl=...)`` would refuse.
        store.supports_ttl = True
        async with serialized_sqlite_setup(Path(connections.database.url.target)):
            await store.setup()
        async with _sweeping(store):
            yield store


@asynccontextmanager
async def _open_postgres(connections: Connections) -> AsyncIterator[BaseStore]:
    from langgraph.store.postgres.aio import AsyncPostgresStore

    assert connections.pool is not None
    async with connections.unbounded() as conn, serialized_setup(conn):
        await AsyncPostgresStore(conn).setup()
    store = AsyncPostgresStore(connections.pool, ttl=TTL)
    async with _sweeping(store):
        yield store


__all__ = ["open_kv_store"]
