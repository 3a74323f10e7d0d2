"""LangGraph's PostgreSQL saver on the process's pool, without its process-wide lock.

Why: ``AsyncPostgresSaver`` takes one ``asyncio.Lock`` around every call, so that a saver built on
a *single* connection never has two cursors on it at once. On a pool that lock is not needed --
each call checks out a connection of its own -- but it is still taken, so every run of the process
waits for every other run's checkpoint writes and reads, one at a time: under ten concurrent runs
PostgreSQL came out 1.5x slower than SQLite (``benchmarks/stores.py``). This saver takes a pool
connection per call and nothing else; the statements, the pipeline around writes and the row
shape (binary, dict rows) are the parent's. A run's own checkpoints stay in order: LangGraph
chains each put after the previous one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agentkeel.runtime.checkpoints.listing import CheckpointHead


class PooledPostgresSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` whose calls run concurrently, each on its own pool connection."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        super().__init__(pool)
        self._pool = pool

    async def alist_metadata(self, thread_id: str) -> AsyncIterator[CheckpointHead]:
        """The thread's root checkpoints, newest first, by id and metadata (``listing.py``)."""
        async with self._cursor() as cur:
            await cur.execute(
                "SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                "ORDER BY checkpoint_id DESC", (thread_id,),
            )
            rows = await cur.fetchall()
        for row in rows:
            yield CheckpointHead(row["checkpoint_id"], "", dict(row["metadata"] or {}))

    @contextlib.asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
        async with self._pool.connection() as conn, contextlib.AsyncExitStack() as stack:
            if pipeline:  # the parent's writes, sent together (in one transaction without pipelines)
                await stack.enter_async_context(conn.pipeline() if self.supports_pipeline else conn.transaction())
            yield await stack.enter_async_context(conn.cursor(binary=True, row_factory=dict_row))


__all__ = ["PooledPostgresSaver"]
