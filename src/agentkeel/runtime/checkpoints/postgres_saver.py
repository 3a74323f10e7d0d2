"""LangGraph's PostgreSQL saver on the process's pool, without its process-wide lock.

Why: ``AsyncPostgresSaver`` takes one ``asyncio.Lock`` around every call, so that a saver built on
a *single* connection never has two cursors on it at once. On a pool that lock is not needed --
each call checks out a connection of its own -- but it is still taken, so every run of the process
waits for every other run's checkpoint writes and reads, one at a time: under ten concurrent runs
PostgreSQL came out 1.5x slower than SQLite (``benchmarks/stores.py``). This saver takes a pool
connection per call and nothing else; the row shape (binary, dict rows) is the parent's. A run's
own checkpoints stay in order: LangGraph chains each put after the previous one.

Why the writes serialise on the loop: the parent hands every ``aput``'s blobs and every
``aput_writes``' values to a worker thread (``asyncio.to_thread``) and waits to be woken. A step
writes twice, so each step paid two thread hops and two extra loop wake-ups: about a third of the
saver's CPU per step (``benchmarks/stores.py --calls``, a 20-message checkpoint). The cost moved
here: a step's serialisation now runs on the loop, as it always has in SQLite's saver -- in the
thread it was Python code under the GIL too, sharing the loop's time in 5 ms slices rather than
taking it in one piece. The rows are the parent's (``_dump_blobs``, ``_dump_writes``), so what is
stored is unchanged (``tests/runtime/test_checkpoints.py`` runs every saver through the same graphs).

Why one statement per write: the parent sends a checkpoint's blobs (``executemany``) and the
checkpoint row in a pipeline, and a task's writes (``executemany``) in another: 125 pipelines and
188 statements for a 30-step run, each pipeline a sync and several socket waits, which made a run on
PostgreSQL about 1.3x one on SQLite. Here a checkpoint is one statement (its new blobs inserted by a
data-modifying CTE, then the row; one transaction, where the parent committed them one by one) and a
task's writes one multi-row ``INSERT``, both built from the parent's own statements (the same
columns and conflict clauses), on an autocommit connection: one round trip each.
"""

from __future__ import annotations

import contextlib
import functools
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
        """One checkpoint and its changed blobs in one statement; serialised here, not in a thread."""
        given = config["configurable"]
        thread_id, ns = given["thread_id"], given["checkpoint_ns"]
        inline, blobs = _split_channels(checkpoint["channel_values"])
        blob_rows = self._dump_blobs(thread_id, ns, blobs, {k: v for k, v in new_versions.items() if k in blobs})
        row = (
            thread_id, ns, checkpoint["id"], given.get("checkpoint_id"),
            Jsonb({**checkpoint, "channel_values": inline}),
            Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
        )
        async with self._cursor() as cur:
            await cur.execute(_checkpoint_sql(self.UPSERT_CHECKPOINT_BLOBS_SQL, self.UPSERT_CHECKPOINTS_SQL,
                                              len(blob_rows)), [v for r in blob_rows for v in r] + list(row))
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "",
    ) -> None:
        """A task's writes in one statement; serialised here, not in a thread."""
        given = config["configurable"]
        # Writes to the special channels (errors, interrupts...) replace; others are kept once.
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        rows = self._dump_writes(
            given["thread_id"], given["checkpoint_ns"], given["checkpoint_id"], task_id, task_path, writes,
        )
        if not rows:
            return
        async with self._cursor() as cur:
            await cur.execute(_rows_sql(self.UPSERT_CHECKPOINT_WRITES_SQL if replace else self.INSERT_CHECKPOINT_WRITES_SQL,
                                        len(rows)), [v for r in rows for v in r])

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
        async with self._pool.connection() as conn:
            # pipeline: the parent's writes, sent together (in one transaction without pipelines)
            batch = (conn.pipeline() if self.supports_pipeline else conn.transaction()) if pipeline else contextlib.nullcontext()
            async with batch, conn.cursor(binary=True, row_factory=dict_row) as cur:
                yield cur


@functools.lru_cache(maxsize=64)
def _rows_sql(sql: str, n: int) -> str:
    """One of the parent's single-row ``INSERT ... VALUES (%s, ...) ON CONFLICT ...`` for ``n`` rows."""
    head, found, tail = sql.partition("VALUES (")
    group, _, rest = tail.partition(")")
    if not found or "(" in group:
        raise ValueError(f"not a one-row VALUES statement: {sql!r}")
    return f"{head}VALUES {', '.join([f'({group})'] * n)}{rest}"


@functools.lru_cache(maxsize=64)
def _checkpoint_sql(blobs_sql: str, checkpoint_sql: str, blobs: int) -> str:
    """The checkpoint's upsert, after its ``blobs`` new blobs' inserts in a data-modifying CTE: one
    statement, so one round trip and one transaction (the parent's pipeline sent two, and committed
    them one by one)."""
    upsert = checkpoint_sql.strip().rstrip(";")
    return f"WITH new_blobs AS ({_rows_sql(blobs_sql, blobs).strip()}) {upsert}" if blobs else upsert


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
