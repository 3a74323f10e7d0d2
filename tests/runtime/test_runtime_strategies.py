"""Multitask strategies when a thread is busy: reject, enqueue, interrupt, rollback."""

from __future__ import annotations

import asyncio
import contextvars
from itertools import pairwise

import pytest
from runtime_support import (
    FAST,
    FULL_MATRIX,
    SLOW,
    UNGATED,
    Keel,
    backend_matrix,
    call,
    data_events,
    describe,
    finished,
    finished_and_deleted,
    journal,
    new_thread_id,
    run_to_end,
    start,
    stored,
    stream_events,
    thread_messages,
    thread_status,
    turn,
    wait_status,
    wait_until,
    workspace,
)

from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.records import ConflictError, MultitaskStrategy, RunRecord, RunStatus
from agentkeel.runtime.runtime import Runtime

pytestmark = backend_matrix(FULL_MATRIX)

# Writes two files (one new, one pre-existing), then hangs in its next model call.
WRITER_THEN_STUCK = [
    turn(
        "Writing.",
        call("write_file", "call_new", path="/workspace/new.txt", content="made by the old run\n"),
        call("write_file", "call_keep", path="/workspace/keep.txt", content="clobbered\n"),
    ),
    turn("Never said.", delay_ms=20_000),
]


async def _messages_at_least(rt: Runtime, thread: str, count: int) -> None:
    async def enough() -> bool:
        return len(await thread_messages(rt, thread)) >= count

    await wait_until(enough, what=f"{count} messages on thread {thread}")


async def test_reject_refuses_a_second_run_and_writes_nothing(keel: Keel) -> None:
    thread = new_thread_id("reject")
    async with keel.open(keel.config({"slow": SLOW, "fast": FAST})) as rt:
        first = await start(rt, thread, "one")
        await wait_status(rt, first.run_id, RunStatus.running)
        with pytest.raises(ConflictError):
            await start(rt, thread, "two", model_name="fast", multitask_strategy=MultitaskStrategy.reject)
        runs = await rt.store.list_runs(thread_id=thread)
        assert [r.run_id for r in runs] == [first.run_id]
        assert runs[0].status == RunStatus.running  # the refusal did not touch the running run
        assert rt.manager.in_flight == 1
        assert await rt.manager.cancel(first.run_id) == "cancelled"
        await finished(rt, first.run_id)


async def test_enqueue_runs_in_admission_order_each_woken_by_the_previous(keel: Keel) -> None:
    thread = new_thread_id("enqueue")
    config = keel.config({"slow": [turn("first done", delay_ms=400)], "fast": [turn("next done")]})
    enqueue = MultitaskStrategy.enqueue
    async with keel.open(config) as rt:
        a = await start(rt, thread, "first", model_name="slow", multitask_strategy=enqueue)
        b = await start(rt, thread, "second", model_name="fast", multitask_strategy=enqueue)
        c = await start(rt, thread, "third", model_name="fast", multitask_strategy=enqueue)
        assert (await stored(rt, b.run_id)).status == RunStatus.pending
        assert (await stored(rt, c.run_id)).status == RunStatus.pending
        runs = [await finished(rt, r.run_id) for r in (a, b, c)]
        assert [r.status for r in runs] == [RunStatus.success] * 3, [r.error for r in runs]
        assert all(r.stop_reasons == [] for r in runs)
        # Admission order, one at a time.
        assert runs[0].created_at <= runs[1].created_at <= runs[2].created_at
        for older, newer in pairwise(runs):
            assert older.ended_at is not None and newer.started_at is not None
            assert older.ended_at <= newer.started_at, (older.ended_at, newer.started_at)
            # Woken by the finishing run, not discovered by a poll.
            gap = (newer.started_at - older.ended_at).total_seconds()
            assert gap < 0.5, gap
        # Each journal's run.start comes after the previous run's run.end.
        journals = [await journal(rt, r.run_id) for r in runs]
        for before, after in pairwise(journals):
            assert before[-1].kind == "run.end" and after[0].kind == "run.start"
            assert before[-1].ts is not None and after[0].ts is not None
            assert before[-1].ts <= after[0].ts
        # The thread saw the three inputs in that order.
        humans = [text for kind, text in describe(await thread_messages(rt, thread)) if kind == "human"]
        assert humans == ["first", "second", "third"]
        assert rt.manager.in_flight == 0


async def test_interrupt_stops_the_older_run_and_keeps_its_checkpoints(keel: Keel) -> None:
    thread = new_thread_id("interrupt")
    config = keel.config({"stuck": WRITER_THEN_STUCK, "fast": [turn("new run done")]})
    async with keel.open(config) as rt:
        old = await start(rt, thread, "old work", model_name="stuck")
        await _messages_at_least(rt, thread, 4)  # human, ai (2 calls), 2 tool results
        new = await start(rt, thread, "new work", model_name="fast",
                          multitask_strategy=MultitaskStrategy.interrupt)
        old_done = await finished(rt, old.run_id)
        new_done = await finished(rt, new.run_id)

        assert old_done.status == RunStatus.interrupted
        assert old_done.stop_reason == "interrupted_by_new_run"
        entry = old_done.stop_reasons[0]
        assert (entry["class"], entry["source"], entry["data"]["action"]) == ("cancellation", "manager", "interrupt")
        assert new.run_id in entry["detail"]
        assert new_done.status == RunStatus.success and new_done.stop_reasons == []
        assert old_done.ended_at is not None and new_done.started_at is not None
        assert old_done.ended_at <= new_done.started_at  # the new run waited for the old to finalize

        # The old run's checkpoints stay; the new run continued from them.
        assert describe(await thread_messages(rt, thread)) == [
            ("human", "old work"), ("ai", "Writing."),
            ("tool", "Wrote 20 bytes to /workspace/new.txt"), ("tool", "Wrote 10 bytes to /workspace/keep.txt"),
            ("human", "new work"), ("ai", "new run done"),
        ]
        assert (workspace(config, thread) / "new.txt").exists()
        assert (await thread_status(rt, thread)) == "idle"
        items = await stream_events(rt, old.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["interrupted_by_new_run"]


async def test_rollback_undoes_the_older_run_and_deletes_it(keel: Keel) -> None:
    thread = new_thread_id("rollback")
    config = keel.config({"fast": [turn("done")], "stuck": WRITER_THEN_STUCK}, limits=UNGATED)
    root = workspace(config, thread)
    (root / "keep.txt").write_text("original\n")
    async with keel.open(config) as rt:
        base = await run_to_end(rt, thread, "baseline")
        before = describe(await thread_messages(rt, thread))
        assert before == [("human", "baseline"), ("ai", "done")]

        old = await start(rt, thread, "old work", model_name="stuck")
        await _messages_at_least(rt, thread, 6)
        assert (root / "keep.txt").read_text() == "clobbered\n" and (root / "new.txt").exists()
        new = await start(rt, thread, "new work", model_name="fast",
                          multitask_strategy=MultitaskStrategy.rollback)
        await finished_and_deleted(rt, old.run_id)  # deleted once rolled back
        new_done = await finished(rt, new.run_id)

        assert new_done.status == RunStatus.success, new_done.error
        assert await rt.store.get(old.run_id) is None
        assert {r.run_id for r in await rt.store.list_runs(thread_id=thread)} == {base.run_id, new.run_id}
        # Workspace: the file it created is gone, the one it overwrote is restored.
        assert not (root / "new.txt").exists()
        assert (root / "keep.txt").read_text() == "original\n"
        # Checkpoints: the pre-run history, then only the new run's messages.
        assert describe(await thread_messages(rt, thread)) == [*before, ("human", "new work"), ("ai", "done")]
        items = await stream_events(rt, old.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["rolled_back"]


async def test_interrupt_of_a_queued_run_finishes_it_without_running_it(keel: Keel) -> None:
    """A pending (enqueued, never started) run displaced by ``interrupt`` ends interrupted at once."""
    thread = new_thread_id("queued")
    async with keel.open(keel.config({"slow": [turn("first done", delay_ms=20_000)], "fast": FAST})) as rt:
        first = await start(rt, thread, "one", model_name="slow", multitask_strategy=MultitaskStrategy.enqueue)
        await _messages_at_least(rt, thread, 1)  # running, its input checkpointed
        queued = await start(rt, thread, "two", model_name="fast", multitask_strategy=MultitaskStrategy.enqueue)
        newest = await start(rt, thread, "three", model_name="fast", multitask_strategy=MultitaskStrategy.interrupt)
        records = await asyncio.gather(*(finished(rt, r.run_id) for r in (first, queued, newest)))
        first_done, queued_done, newest_done = records
        assert first_done.status == queued_done.status == RunStatus.interrupted
        assert queued_done.started_at is None  # it never ran
        assert queued_done.stop_reason == first_done.stop_reason == "interrupted_by_new_run"
        assert newest_done.status == RunStatus.success
        humans = [text for kind, text in describe(await thread_messages(rt, thread)) if kind == "human"]
        assert humans == ["one", "three"]
        assert (await stream_events(rt, queued.run_id))[-1].kind is EventKind.end


_ADMITTER = contextvars.ContextVar[str]("admitter")


async def test_a_startable_run_is_started_by_its_admission_in_the_workers_context(keel: Keel) -> None:
    seen: list[str] = []

    async def hook(record: RunRecord) -> None:
        seen.append(_ADMITTER.get("unset"))

    async with keel.open(keel.config({"hold": [turn("Done.", delay_ms=300)]}), completion_hooks=[hook]) as rt:
        _ADMITTER.set("the request handler")
        free = await start(rt, new_thread_id("admitted"), "go")
        # Claimed before create returned (the claim loop was never woken for it)...
        assert rt.manager.active(free.run_id) is not None
        assert (await stored(rt, free.run_id)).status == RunStatus.running
        # ...while a run queued behind it waits for its turn.
        queued = await start(rt, free.thread_id, "next", multitask_strategy=MultitaskStrategy.enqueue)
        assert (await stored(rt, queued.run_id)).status == RunStatus.pending
        await finished(rt, queued.run_id)
    assert seen == ["unset", "unset"]  # neither run saw the admitting task's context variables
