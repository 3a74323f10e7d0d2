"""The two database savers' own behaviour: SQLite's on the event loop's thread (a busy database is
waited out without holding the loop), PostgreSQL's on the pool without a process-wide lock."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from runtime_support import checkpointer_on

from agentkeel.runtime.checkpoints.listing import ListsMetadata, checkpoint_heads
from agentkeel.runtime.checkpoints.postgres_saver import PooledPostgresSaver
from agentkeel.runtime.checkpoints.sqlite_saver import InlineSqliteSaver


def _config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _hold_write_lock(path: Path, held: threading.Event, release: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    held.set()
    release.wait(10)
    conn.execute("ROLLBACK")
    conn.close()


async def test_a_busy_sqlite_database_is_waited_out_without_holding_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "keel.db"
    async with checkpointer_on(f"sqlite:///{path}") as saver:
        assert isinstance(saver, InlineSqliteSaver)
        held, release = threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(path, held, release))
        holder.start()
        try:
            await asyncio.to_thread(held.wait, 10)
            checkpoint: Any = empty_checkpoint()
            put = asyncio.create_task(saver.aput(_config("t1"), checkpoint, {"source": "input", "step": -1}, {}))
            ticks = 0
            for _ in range(20):  # the loop keeps turning while the write waits for the lock
                await asyncio.sleep(0.005)
                ticks += 1
            assert not put.done()  # still waiting: another connection holds the write lock
            assert ticks == 20
        finally:
            release.set()
            await asyncio.to_thread(holder.join)
        stored = await asyncio.wait_for(put, 10)
        fetched = await saver.aget_tuple(stored)
        assert fetched is not None and fetched.checkpoint["id"] == checkpoint["id"]


@pytest.mark.postgres
async def test_postgres_saver_calls_do_not_wait_for_each_other(pg_url: str) -> None:
    async with checkpointer_on(pg_url) as saver:
        assert isinstance(saver, PooledPostgresSaver)
        thread = f"t-{uuid.uuid4().hex[:8]}"
        stored = await saver.aput(_config(thread), empty_checkpoint(), {"source": "input", "step": -1}, {})
        entered, leave = asyncio.Event(), asyncio.Event()

        async def hold_a_cursor() -> None:
            async with saver._cursor() as cur:  # one call in progress, as a slow write would be
                await cur.execute("SELECT 1")
                entered.set()
                await leave.wait()

        holder = asyncio.create_task(hold_a_cursor())
        await asyncio.wait_for(entered.wait(), 10)
        try:
            # With a process-wide lock this read would wait until the holder leaves (never, here).
            fetched = await asyncio.wait_for(saver.aget_tuple(stored), 10)
            assert fetched is not None
        finally:
            leave.set()
            await holder


@pytest.mark.parametrize("backend", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_listing_by_metadata_matches_langgraphs_listing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``checkpoint_heads`` (metadata only, on the database savers) lists what ``alist`` lists for
    the thread's root namespace: same ids, same order, same metadata."""
    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path / 'keel.db'}"}.get(backend) or request.getfixturevalue("pg_url")
    async with checkpointer_on(url) as saver:
        thread = f"t-{uuid.uuid4().hex[:8]}"
        config = _config(thread)
        for step in range(3):
            checkpoint: Any = empty_checkpoint()
            metadata: Any = {"source": "loop", "step": step, "agentkeel_coordinate": {"run_id": "r1", "journal_seq": step}}
            config = await saver.aput(config, checkpoint, metadata, {})
        nested: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": "child:1"}}
        await saver.aput(nested, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        expected = [(t.config["configurable"]["checkpoint_id"], dict(t.metadata))
                    async for t in saver.alist({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})]
        heads = [head async for head in checkpoint_heads(saver, thread)]
        assert [(h.checkpoint_id, h.metadata) for h in heads] == expected
        assert [h.metadata["step"] for h in heads] == [2, 1, 0] and all(h.checkpoint_ns == "" for h in heads)
        assert isinstance(saver, ListsMetadata) == (backend != "memory")


@pytest.mark.parametrize("backend", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_checkpoints_blobs_and_a_tasks_writes_read_back_as_written(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Several new blobs with one checkpoint, several writes of one task (PostgreSQL's saver sends
    each as one statement), a special channel's writes replacing, a re-put keeping the blobs."""
    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path / 'keel.db'}"}.get(backend) or request.getfixturevalue("pg_url")
    async with checkpointer_on(url) as saver:
        thread = f"t-{uuid.uuid4().hex[:8]}"
        checkpoint: Any = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": ["a", {"b": 1}], "notes": {"k": [1, 2]}, "title": "x", "n": 3}
        versions = {"messages": "1", "notes": "1", "title": "1", "n": "1"}
        checkpoint["channel_versions"] = versions
        metadata: Any = {"source": "loop", "step": 0}
        stored = await saver.aput(_config(thread), checkpoint, metadata, versions)
        await saver.aput_writes(stored, [("messages", "m1"), ("notes", {"z": 0}), ("title", "y")], "task-1")
        await saver.aput_writes(stored, [("__error__", "first")], "task-2")
        await saver.aput_writes(stored, [("__error__", "second")], "task-2")  # special channels replace
        await saver.aput(_config(thread), checkpoint, metadata, versions)  # the same blobs again: kept once
        fetched = await saver.aget_tuple(stored)
        assert fetched is not None
        assert fetched.checkpoint["channel_values"] == checkpoint["channel_values"]
        writes = sorted((task, channel, value) for task, channel, value in fetched.pending_writes or [])
        assert writes == [("task-1", "messages", "m1"), ("task-1", "notes", {"z": 0}), ("task-1", "title", "y"),
                          ("task-2", "__error__", "second")]


async def test_a_primed_head_answers_the_run_graphs_first_head_read_once() -> None:
    """The worker hands the head it read for the rollback point to the run's saver: the graph's
    first read of that head is answered from it, and only that one read."""
    from langgraph.checkpoint.memory import InMemorySaver

    from agentkeel.runtime.checkpoints.stamping import StampingSaver
    from agentkeel.runtime.journal import Journal
    from agentkeel.runtime.stores.memory import MemoryJournalStore

    inner = InMemorySaver()
    reads: list[dict[str, Any]] = []
    read = inner.aget_tuple

    async def counted(config: RunnableConfig) -> Any:
        reads.append(dict(config["configurable"]))
        return await read(config)

    inner.aget_tuple = counted  # type: ignore[method-assign]
    await inner.aput(_config("t1"), empty_checkpoint(), {"step": -1}, {})
    head = await inner.aget_tuple(_config("t1"))
    assert head is not None
    reads.clear()
    saver = StampingSaver(inner, await Journal.open(MemoryJournalStore(), "r1", "t1", empty=True))

    saver.prime_head("t1", head)
    assert await saver.aget_tuple(_config("t1")) is head and reads == []
    assert (await saver.aget_tuple(_config("t1"))) is not None and len(reads) == 1  # once only

    saver.prime_head("t1", None)  # "no checkpoint" is an answer too
    assert await saver.aget_tuple(_config("t1")) is None and len(reads) == 1

    # Any other read goes to the saver, and the prime is spent.
    for other in (_config("t2"), {"configurable": {**_config("t1")["configurable"], "checkpoint_ns": "sub"}},
                  {"configurable": {**_config("t1")["configurable"], "checkpoint_id": head.checkpoint["id"]}}):
        saver.prime_head("t1", None)
        await saver.aget_tuple(other)
        assert (await saver.aget_tuple(_config("t1"))) is not None
    assert len(reads) == 7
