"""LangGraph's SQLite saver on a connection that runs on the event loop's thread.

Why: ``AsyncSqliteSaver`` hands every call to aiosqlite's thread and waits for the loop to be woken.
A checkpoint write is a handful of such hand-offs per step (insert, commit, the pending writes),
and the thread switches, the GIL ping-pong and the self-pipe cost more than SQLite's own work:
``benchmarks/run_overhead.py`` put them at most of the SQLite checkpointer's cost per step.
The stores already run inline for the same reason (``runtime/sqlite_inline.py``).

Why that stays correct: the inline connection has ``busy_timeout = 0`` (SQLite's busy handler
would sleep on the loop's thread), so a lock held by another connection -- the stores', another
process's -- fails a write at once with ``SQLITE_BUSY``. Each writing call rolls back and is run
again whole by ``retry_while_busy`` (so is ``setup``); every statement the saver writes is ``INSERT OR REPLACE`` /
``INSERT OR IGNORE`` / ``DELETE`` of the same rows, so running it twice is running it once. The
connection keeps the driver's implicit ``BEGIN`` before a write, so a step's pending writes
(several rows) still commit together, as on aiosqlite. Reads are not retried: under WAL a reader
never waits for a writer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from agentkeel.runtime.checkpoints.listing import CheckpointHead
from agentkeel.runtime.sqlite_inline import connect_inline, inline_pragmas, retry_while_busy


class InlineSqliteSaver(AsyncSqliteSaver):
    """``AsyncSqliteSaver`` whose writes are retried while the database is busy (see above)."""

    async def _rollback(self) -> None:
        async with self.lock:  # the connection is shared by the saver's calls
            await self.conn.rollback()

    async def setup(self) -> None:
        # Idempotent (CREATE ... IF NOT EXISTS, a column added only when missing), and it marks
        # itself done only at its end, so a busy failure half-way is simply run again.
        async def attempt() -> None:
            await AsyncSqliteSaver.setup(self)

        await retry_while_busy(attempt, after_busy=self._rollback)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        async def attempt() -> RunnableConfig:
            return await AsyncSqliteSaver.aput(self, config, checkpoint, metadata, new_versions)

        return await retry_while_busy(attempt, after_busy=self._rollback)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        async def attempt() -> None:
            await AsyncSqliteSaver.aput_writes(self, config, writes, task_id, task_path)

        await retry_while_busy(attempt, after_busy=self._rollback)

    async def alist_metadata(self, thread_id: str) -> AsyncIterator[CheckpointHead]:
        """The thread's root checkpoints, newest first, by id and metadata (``listing.py``)."""
        query = ("SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
                 "ORDER BY checkpoint_id DESC")
        async with self.lock, self.conn.execute(query, (thread_id,)) as cursor:
            rows = await cursor.fetchall()
        for checkpoint_id, metadata in rows:
            yield CheckpointHead(checkpoint_id, "", json.loads(metadata) if metadata else {})

    async def adelete_thread(self, thread_id: str) -> None:
        async def attempt() -> None:
            await AsyncSqliteSaver.adelete_thread(self, thread_id)

        await retry_while_busy(attempt, after_busy=self._rollback)


@asynccontextmanager
async def open_inline_sqlite_saver(path: Path) -> AsyncIterator[InlineSqliteSaver]:
    """An ``InlineSqliteSaver`` on its own inline connection to ``path`` (WAL, ``synchronous =
    NORMAL`` as the stores; ``setup()`` not yet run); the connection is closed on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await connect_inline(path, isolation_level="DEFERRED")
    try:
        for pragma in inline_pragmas():
            await conn.execute(pragma)
        yield InlineSqliteSaver(conn)
    finally:
        await conn.close()


__all__ = ["InlineSqliteSaver", "open_inline_sqlite_saver"]
