"""Opening the LangGraph checkpointer on the process's connection layer.

The checkpointer shares the runtime's one database; LangGraph's tables (``checkpoints``,
``writes``, ``checkpoint_blobs``, ...) live beside the run and journal stores' own tables. On
PostgreSQL it uses the one pool of ``runtime/connections.py``; on SQLite it keeps its own aiosqlite
connection (LangGraph's SQLite saver takes a single connection, not a pool).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.runtime.connections import Connections, sqlite_connection
from agentkeel.runtime.langgraph_setup import serialized_setup, serialized_sqlite_setup


@asynccontextmanager
async def open_checkpointer(connections: Connections) -> AsyncIterator[BaseCheckpointSaver]:
    """Yield a ready (``setup()`` done) async saver for ``connections``' database; close it on exit.

    ``memory://`` → ``InMemorySaver``; SQLite → ``AsyncSqliteSaver``; PostgreSQL →
    ``AsyncPostgresSaver`` on the shared pool.
    """
    backend = connections.database.url.backend
    if backend == "memory":
        yield InMemorySaver()
    elif backend == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with sqlite_connection(connections) as conn:
            saver = AsyncSqliteSaver(conn)
            async with serialized_sqlite_setup(Path(connections.database.url.target)):
                await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        assert connections.pool is not None
        async with connections.unbounded() as conn, serialized_setup(conn):
            await AsyncPostgresSaver(conn).setup()
        yield AsyncPostgresSaver(connections.pool)


__all__ = ["open_checkpointer"]
