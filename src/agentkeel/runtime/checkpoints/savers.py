"""Opening the LangGraph checkpointer for a database URL.

The checkpointer shares the runtime's one database URL; LangGraph's tables (``checkpoints``,
``writes``, ``checkpoint_blobs``, ...) live beside the run and journal stores' own tables. The
connection settings are explained in ``runtime/langgraph_db.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.runtime.langgraph_db import parse_database_url, postgres_pool, sqlite_connection


@asynccontextmanager
async def open_checkpointer(database_url: str) -> AsyncIterator[BaseCheckpointSaver]:
    """Yield a ready (``setup()`` done) async saver for ``database_url``; close it on exit.

    ``memory://`` → ``InMemorySaver``; ``sqlite:///relative/path`` or ``sqlite:////abs/path`` (also
    ``sqlite+aiosqlite://``) → ``AsyncSqliteSaver``; ``postgresql://`` / ``postgres://`` (also
    ``postgresql+psycopg://``) → ``AsyncPostgresSaver`` on a connection pool.
    """
    backend, target = parse_database_url(database_url, "checkpoint")
    if backend == "memory":
        yield InMemorySaver()
    elif backend == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with sqlite_connection(target) as conn:
            saver = AsyncSqliteSaver(conn)
            await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with postgres_pool(target) as pool:
            pg_saver = AsyncPostgresSaver(pool)
            await pg_saver.setup()
            yield pg_saver


__all__ = ["open_checkpointer"]
