"""LangGraph's PostgreSQL saver on the process's pool, without its process-wide lock.

Why: ``AsyncPostgresSaver`` takes one ``asyncio.Lock`` around every call, so that a saver built on
a *single* connection never has two cursors on it at once. On a pool that lock is not needed --
each call checks out a connection of its own -- but it is still taken, so every run of the process
waits for every other run's checkpoint writes and reads, one at a time: under ten concurrent runs
PostgreSQL came out 1.5x slower than SQLite (``benchmarks/stores.py``). This saver takes a pool
connection per call and nothing else; the statements, the pipeline around writes and the row
shape (binary, dict rows) are the parent's. A run's own checkpoints stay in order: LangGraph
chains each put after the previous one.

Why the writes serialise on the loop: the parent hands every ``aput``'s blobs and every
``aput_writes``' values to a worker thread (``asyncio.to_thread``) and waits to be woken. A step
writes twice, so each step paid two thread hops and two extra loop wake-ups: about a third of the
saver's CPU per step (``benchmarks/stores.py --calls``, a 20-message checkpoint). The cost moved
here: a step's serialisation now runs on the loop, as it always has in SQLite's saver -- in the
thread it was Python code under the GIL too, sharing the loop's time in 5 ms slices rather than
taking it in one piece. The rows are the parent's (``_dump_blobs``, ``_dump_writes``) and so are
the statements, so what is stored is unchanged (``tests/runtime/test_checkpoints.py`` runs every
saver through the same graphs).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from agentkeel.runtime.checkpoints.listing import CheckpointHead


class PooledPostgresSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` whose calls run concurrently, each on its own pool connection."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        super().__init__(pool)
        self._pool = pool

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """One checkpoint and its changed blobs, sent in one pipeline; serialised here, not in a thread."""
        given = config["configurable"]
        thread_id, ns = given["thread_id"], given["checkpoint_ns"]
        inline, blobs = _split_channels(checkpoint["channel_values"])
        blob_rows = self._dump_blobs(thread_id, ns, blobs, {k: v for k, v in new_versions.items() if k in blobs})
        row = (
            thread_id, ns, checkpoint["id"], given.get("checkpoint_id"),
            Jsonb({**checkpoint, "channel_values": inline}),
            Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
        )
        async with self._cursor(pipeline=True) as cur:
            if blob_rows:
                await cur.executemany(self.UPSERT_CHECKPOINT_BLOBS_SQL, blob_rows)
            await cur.execute(self.UPSERT_CHECKPOINTS_SQL, row)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "",
    ) -> None:
        """A task's writes in one pipeline; serialised here, not in a thread."""
        given = config["configurable"]
        # Writes to the special channels (errors, interrupts...) replace; others are kept once.
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        rows = self._dump_writes(
            given["thread_id"], given["checkpoint_ns"], given["checkpoint_id"], task_id, task_path, writes,
        )
        async with self._cursor(pipeline=True) as cur:
            await cur.executemany(
                self.UPSERT_CHECKPOINT_WRITES_SQL if replace else self.INSERT_CHECKPOINT_WRITES_SQL, rows,
            )

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


def _split_channels(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kept in the checkpoint row, stored as blobs): primitives stay in the row's JSON; anything
    else is a blob, and a delta channel's snapshot is a blob marked ``True`` in the row."""
    inline: dict[str, Any] = {}
    blobs: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, _DeltaSnapshot):
            blobs[key], inline[key] = value, True
        elif value is None or isinstance(value, (str, int, float, bool)):
            inline[key] = value
        else:
            blobs[key] = value
    return inline, blobs


__all__ = ["PooledPostgresSaver"]
