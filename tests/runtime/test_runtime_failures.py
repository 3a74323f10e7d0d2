"""How a run ends when something fails: the journal, ownership (fencing), time, the graph's step
limit. Every case still ends with an honest terminal record and END."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from runtime_support import (
    DATABASE_MATRIX,
    LIGHT_MATRIX,
    Keel,
    backend_matrix,
    call,
    data_events,
    finished,
    journal,
    new_thread_id,
    recording_hook,
    run_to_end,
    start,
    stream_events,
    thread_status,
    turn,
    wait_status,
)

from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.journal import Journal
from agentkeel.runtime.manager import RunManager
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.stores.base import JournalEvent, JournalStore
from agentkeel.runtime.worker import WorkerDeps


class _JournalWrapper(JournalStore):
    """Delegates to a real journal store; subclasses break one operation."""

    def __init__(self, inner: JournalStore) -> None:
        self.inner = inner
        self.append_attempts = 0

    async def append(self, events: list[JournalEvent]) -> None:
        await self.inner.append(events)

    async def list(self, run_id: str, after_seq: int = 0, limit: int | None = None,
                   kinds: list[str] | None = None) -> list[JournalEvent]:
        return await self.inner.list(run_id, after_seq, limit, kinds)

    async def delete_run(self, run_id: str) -> None:
        await self.inner.delete_run(run_id)


class _UnreadableJournal(_JournalWrapper):
    async def list(self, run_id: str, after_seq: int = 0, limit: int | None = None,
                   kinds: list[str] | None = None) -> list[JournalEvent]:
        raise RuntimeError("journal store unreachable")


class _UnwritableJournal(_JournalWrapper):
    async def append(self, events: list[JournalEvent]) -> None:
        self.append_attempts += 1
        raise RuntimeError("journal disk full")


async def _manager(rt: Runtime, journal_store: JournalStore, hooks: list[Any] | None = None) -> RunManager:
    """The worker over the runtime's stores, bridge and checkpointer, with another journal (the
    runtime itself is opened without a worker, so this manager's claims every run)."""
    deps = WorkerDeps(
        store=rt.store, journal_store=journal_store, bridge=rt.bridge, checkpointer=rt.checkpointer,
        harness=rt.harness, config=rt.config, owner="test-worker", checkpoint_mode=rt.config.checkpoint_mode,
        completion_hooks=list(hooks or []),
    )
    manager = RunManager(deps, rt.harness, rt.config.limits)
    await manager.start()
    return manager


# -- the journal --------------------------------------------------------------------------------


@backend_matrix(LIGHT_MATRIX)
async def test_a_journal_that_cannot_be_opened_fails_the_run_with_end(
    keel: Keel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentkeel.runtime.requests import RunRequest

    async def unreachable(*_args: Any, **_kwargs: Any) -> Journal:
        raise RuntimeError("journal store unreachable")

    monkeypatch.setattr(Journal, "open", unreachable)
    thread = new_thread_id("jopen")
    async with keel.open(executes="none") as rt:
        seen: list[RunRecord] = []
        manager = await _manager(rt, rt.journal, [recording_hook(seen)])
        try:
            run = await manager.create(RunRequest(thread_id=thread, input="hi"))
            done = await manager.wait(run.run_id)
        finally:
            await manager.shutdown(1.0)
        assert done is not None and done.status == RunStatus.error
        assert "journal store unreachable" in str(done.error)
        assert done.started_at is not None  # claimed (running), then failed opening its journal
        assert [r.run_id for r in seen] == [run.run_id]  # completion hooks still ran
        assert (await thread_status(rt, thread)) == "error"
        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end
        (error,) = data_events(items, "error")
        assert "journal store unreachable" in error.data["message"]
        assert manager.in_flight == 0


@backend_matrix(LIGHT_MATRIX)
async def test_a_first_attempt_opens_its_journal_without_reading_the_store(keel: Keel) -> None:
    """A run's first attempt has nothing journaled before it, so opening its journal costs no
    read: over a journal store whose reads all fail, the run still succeeds, every event in order."""
    from agentkeel.runtime.requests import RunRequest

    config = keel.config({"m": [turn("Looking.", call("ls", path="/workspace")), turn("Fine.")]})
    async with keel.open(config, executes="none") as rt:
        manager = await _manager(rt, _UnreadableJournal(rt.journal))
        try:
            run = await manager.create(RunRequest(thread_id=new_thread_id("jfresh"), input="hi"))
            done = await manager.wait(run.run_id)
        finally:
            await manager.shutdown(1.0)
        assert done is not None and done.status == RunStatus.success, done and done.error
        events = await rt.journal.list(run.run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[0].kind == "run.start" and events[-1].kind == "run.end"


@backend_matrix(LIGHT_MATRIX)
async def test_journal_writes_failing_after_start_do_not_fail_the_run(
    keel: Keel, caplog: pytest.LogCaptureFixture
) -> None:
    from agentkeel.runtime.requests import RunRequest

    config = keel.config({"m": [turn("Looking.", call("ls", path="/workspace")), turn("Fine.")]})
    async with keel.open(config, executes="none") as rt:
        broken = _UnwritableJournal(rt.journal)
        manager = await _manager(rt, broken)
        try:
            with caplog.at_level(logging.WARNING, logger="agentkeel.runtime.journal"):
                run = await manager.create(RunRequest(thread_id=new_thread_id("jwrite"), input="hi"))
                done = await manager.wait(run.run_id)
        finally:
            await manager.shutdown(1.0)
        assert done is not None
        assert done.status == RunStatus.success and done.error is None and done.stop_reasons == []
        assert done.usage["by_caller"]["lead"]["calls"] == 2  # accounting does not depend on the journal
        assert broken.append_attempts >= 1
        # Nothing the journal writer buffered reached the store, only the end, which is written
        # with the completion by the run store...
        assert [e.kind for e in await rt.journal.list(run.run_id)] == ["run.end"]
        messages = [r.getMessage() for r in caplog.records if r.name == "agentkeel.runtime.journal"]
        assert any("journal disk full" in m for m in messages), messages  # ...and that was logged
        assert (await stream_events(rt, run.run_id))[-1].kind is EventKind.end


# -- fencing ------------------------------------------------------------------------------------


@backend_matrix(DATABASE_MATRIX)
async def test_a_taken_over_run_cannot_write_its_completion(keel: Keel, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[RunRecord] = []
    config = keel.config({"slowish": [turn("Finished anyway.", delay_ms=700)]})
    async with keel.open(config, completion_hooks=[recording_hook(seen)]) as rt:
        thread = new_thread_id("fence")
        run = await start(rt, thread, "hi")
        running = await wait_status(rt, run.run_id, RunStatus.running)
        assert running.attempt == 1
        taken = await rt.store.claim(run.run_id, "other-owner", None)
        assert (taken.attempt, taken.owner) == (2, "other-owner")

        with caplog.at_level(logging.WARNING, logger="agentkeel.runtime.worker"):
            stored = await finished(rt, run.run_id)
        # The old attempt ran to the end, but its completion was refused: the newer owner's record
        # stands, untouched.
        assert stored.status == RunStatus.running
        assert (stored.attempt, stored.owner) == (2, "other-owner")
        assert stored.ended_at is None and stored.error is None and stored.stop_reasons == []
        assert stored.usage["total_tokens"] == 0
        assert any("completion refused" in r.getMessage() for r in caplog.records)
        assert seen == []  # completion hooks are for the completion that was written
        # Nor does it publish END: the run is not over, its new owner will end the stream.
        with pytest.raises(TimeoutError):
            await stream_events(rt, run.run_id, timeout=1.0, heartbeat_s=0.2)
        assert rt.manager.in_flight == 0


# -- time and steps -----------------------------------------------------------------------------


@backend_matrix(LIGHT_MATRIX)
async def test_the_wall_clock_limit_ends_the_run_with_timeout(keel: Keel) -> None:
    config = keel.config({"slow": [turn("Too late.", delay_ms=2000)]}, limits={"run_timeout_s": 0.3})
    async with keel.open(config) as rt:
        began = time.monotonic()
        run = await run_to_end(rt, new_thread_id("timeout"), "hi")
        assert time.monotonic() - began < 1.8  # stopped at the limit, not after the slow call
        assert run.status == RunStatus.timeout
        assert run.stop_reason == "timeout"
        (entry,) = run.stop_reasons
        assert (entry["class"], entry["source"], entry["data"]["limit_s"]) == ("budget", "worker", 0.3)
        assert "0.3" in str(run.error)
        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["timeout"]
        assert (await journal(rt, run.run_id))[-1].data["status"] == "timeout"


@backend_matrix(LIGHT_MATRIX)
async def test_a_provider_timeout_is_an_error_not_a_run_timeout(keel: Keel) -> None:
    # A provider timeout is retried (LLMErrorHandling), and once the attempts run out the run ends
    # `error` with a message saying so — never `timeout`, which is the run's own wall-clock limit.
    config = keel.config(
        {"flaky": [{"raise": {"kind": "timeout", "message": "upstream read timed out"}, "repeat": "forever"}]},
        limits={"llm_retry": {"max_attempts": 2, "base_delay_ms": 0, "max_delay_ms": 0}},
    )
    async with keel.open(config) as rt:
        run = await run_to_end(rt, new_thread_id("ptimeout"), "hi")
        assert run.status == RunStatus.error
        assert run.stop_reasons == [] and run.stop_reason is None
        assert "upstream read timed out" in str(run.error) and "after 2 attempts" in str(run.error)
        events = await journal(rt, run.run_id)
        errors = [e for e in events if e.kind == "model.error"]
        assert [e.data["error_type"] for e in errors] == ["ScriptedTimeoutError"] * 2
        retries = [e for e in events if e.kind == "intervention" and e.data["action"] == "retry"]
        assert len(retries) == 1 and retries[0].data["middleware"] == "LLMErrorHandling"
        assert events[-1].kind == "run.end" and events[-1].data["status"] == "error"
        assert (await thread_status(rt, run.thread_id)) == "error"


@backend_matrix(LIGHT_MATRIX)
async def test_the_recursion_limit_caps_an_endless_tool_loop(keel: Keel) -> None:
    endless = [{**turn("Again.", call("ls", path="/workspace")), "repeat": "forever"}]
    config = keel.config({"loop": endless}, limits={"recursion_limit": 6, "max_recursion_limit": 8})
    async with keel.open(config) as rt:
        run = await run_to_end(rt, new_thread_id("recur"), "hi")
        assert run.status == RunStatus.error
        assert run.stop_reason == "recursion_capped"
        (entry,) = run.stop_reasons
        assert (entry["class"], entry["source"], entry["data"]["recursion_limit"]) == ("limit", "worker", 6)
        # model, tools, model, tools, model, tools: DurableContext adds no node.
        assert run.usage["by_caller"]["lead"]["calls"] == 3
        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end

        # A request may lower the limit, and cannot raise it past max_recursion_limit.
        low = await run_to_end(rt, new_thread_id("recur"), "hi", config={"recursion_limit": 2})
        high = await run_to_end(rt, new_thread_id("recur"), "hi", config={"recursion_limit": 500})
        assert [r.stop_reasons[0]["data"]["recursion_limit"] for r in (low, high)] == [2, 8]
        assert low.stop_reason == high.stop_reason == "recursion_capped"
