"""Opening the LangGraph checkpointer on the process's connection layer.

The checkpointer shares the runtime's one database; LangGraph's tables (``checkpoints``,
``writes``, ``checkpoint_blobs``, ...) live beside the run and journal stores' own tables. On
PostgreSQL it uses the one pool of ``runtime/connections.py``; on SQLite it keeps one connection of
its own (LangGraph's SQLite saver takes a single connection, not a pool), run on the event loop's
thread (``sqlite_saver.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.runtime.connections import Connections
from agentkeel.runtime.langgraph_setup import serialized_setup, serialized_sqlite_setup


@asynccontextmanager
async def open_checkpointer(connections: Connections) -> AsyncIterator[BaseCheckpointSaver]:
    """Yield a ready (``setup()`` done) async saver for ``connections``' database; close it on exit.

    ``memory://`` → ``InMemorySaver``; SQLite → ``InlineSqliteSaver``; PostgreSQL →
    ``PooledPostgresSaver`` on the shared pool.
    """
    backend = connections.database.url.backend
    if backend == "memory":
        yield InMemorySaver()
    elif backend == "sqlite":
        from agentkeel.runtime.checkpoints.sqlite_saver import open_inline_sqlite_saver

        path = Path(connections.database.url.target)
        async with open_inline_sqlite_saver(path) as saver:
            async with serialized_sqlite_setup(path):
                await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        from agentkeel.runtime.checkpoints.postgres_saver import PooledPostgresSaver

        assert connections.pool is not None
        async with connections.unbounded() as conn, serialized_setup(conn):
            await AsyncPostgresSaver(conn).setup()
        yield PooledPostgresSaver(connections.pool)


__all__ = ["open_checkpointer"]
