"""A run that does not end on its own leaves no delegation ``in_progress``.

The lead's ``task`` call is recorded ``in_progress`` with the model step; a cancelled or timed-out
run never reaches the agent's ``after_agent``, so the worker closes the entry while finalizing —
in the thread's checkpointed state, through the ledger's reducer. A ``task`` tool that blocks
stands in for a subagent still working.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.tools import BaseTool, tool
from runtime_support import (
    LIGHT_MATRIX,
    Keel,
    backend_matrix,
    call,
    finished,
    new_thread_id,
    start,
    thread_state,
    thread_status,
    turn,
    wait_until,
)

import agentkeel.harness.agents as agents_module
from agentkeel.harness.durable import durable_values
from agentkeel.runtime.checkpoints import StateAccessor
from agentkeel.runtime.delegations import CLOSE_NODE
from agentkeel.runtime.manager import CancelOutcome
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)

DELEGATE = [
    turn("Delegating.", call("task", "call-sub", description="Research the claims", prompt="Research them.")),
    turn("Never said."),
]


@pytest.fixture
def subagent(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Adds a ``task`` tool that blocks until the run is stopped; the event says it started."""
    started = asyncio.Event()

    async def task(description: str, prompt: str = "") -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    blocking: BaseTool = tool("task", description="Delegate work to a subagent.")(task)
    build_tools = agents_module.build_tools

    def with_task(*args: Any, **kwargs: Any) -> list[BaseTool]:
        return [*build_tools(*args, **kwargs), blocking]

    monkeypatch.setattr(agents_module, "build_tools", with_task)
    monkeypatch.setattr(agents_module, "_delegates", lambda tools: False)  # the stand-in is the only `task`
    return started


async def _ledger(rt: Any, thread: str) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in durable_values((await thread_state(rt, thread)).values)["delegations"]}


@pytest.mark.parametrize("mode", ["full", "delta"])
async def test_a_cancelled_runs_delegation_is_closed_in_the_thread_state(
    keel: Keel, subagent: asyncio.Event, mode: str
) -> None:
    config = keel.config({"delegate": DELEGATE}, checkpoint_mode=mode)
    thread = new_thread_id("deleg")
    async with keel.open(config) as rt:
        run = await start(rt, thread, "analyse the paper")
        await asyncio.wait_for(subagent.wait(), 10)
        # Checkpointed with the model step (the saver may store it just after the tool started).
        entry = (await wait_until(lambda: _ledger(rt, thread), what="the ledger entry"))["call-sub"]
        assert (entry["status"], entry["run_id"]) == ("in_progress", run.run_id)

        assert await rt.manager.cancel(run.run_id) == CancelOutcome.cancelled
        done = await finished(rt, run.run_id)
        assert done.status == RunStatus.interrupted
        entry = (await _ledger(rt, thread))["call-sub"]
        assert entry["status"] == "cancelled"
        assert entry["stop_reason"] == "the run was stopped before the delegation finished"
        assert (entry["description"], entry["run_id"]) == ("Research the claims", run.run_id)  # kept
        head = await thread_state(rt, thread)
        assert (head.metadata or {}).get("writes", {}).keys() <= {CLOSE_NODE}


async def test_a_timed_out_runs_delegation_is_closed_as_timed_out(keel: Keel, subagent: asyncio.Event) -> None:
    config = keel.config({"delegate": DELEGATE})
    thread = new_thread_id("deleg")
    async with keel.open(config) as rt:
        run = await start(rt, thread, "analyse the paper", timeout_s=1.0)
        done = await finished(rt, run.run_id)
        assert done.status == RunStatus.timeout and subagent.is_set()
        assert (await _ledger(rt, thread))["call-sub"]["status"] == "timed_out"


async def test_a_run_that_ends_on_its_own_is_not_rewritten(keel: Keel) -> None:
    config = keel.config({"fast": [turn("All done.")]})
    thread = new_thread_id("deleg")
    async with keel.open(config) as rt:
        run = await start(rt, thread, "hello")
        done = await finished(rt, run.run_id)
        assert done.status == RunStatus.success
        head = await thread_state(rt, thread)
        assert CLOSE_NODE not in ((head.metadata or {}).get("writes") or {})
        assert durable_values(head.values)["delegations"] == []


async def test_finalizing_reads_the_threads_state_once(keel: Keel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing delegations and settling the thread's status share one full read of the state
    (a read decodes every message of the thread): a run's finalization makes exactly one."""
    reads: list[str] = []
    aget = StateAccessor.aget

    async def counted(self: StateAccessor, thread_id: str, checkpoint_id: str | None = None) -> Any:
        reads.append(thread_id)
        return await aget(self, thread_id, checkpoint_id)

    monkeypatch.setattr(StateAccessor, "aget", counted)
    config = keel.config({"fast": [turn("All done.")]})
    thread = new_thread_id("deleg")
    async with keel.open(config) as rt:
        run = await start(rt, thread, "hello")
        assert (await finished(rt, run.run_id)).status == RunStatus.success
        await wait_until(lambda: _settled(rt, thread), what="the thread settled")
        assert reads == [thread]


async def _settled(rt: Any, thread: str) -> bool:
    return await thread_status(rt, thread) == "idle"


async def test_a_result_that_arrived_before_the_stop_is_taken_in_not_cancelled(
    keel: Keel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subagent finished, then the run was cancelled while the model was thinking about its
    result: the entry is ``completed`` (its result is in the thread), not ``cancelled``."""

    async def task(description: str, prompt: str = "") -> str:
        return "the claims hold"

    quick: BaseTool = tool("task", description="Delegate work to a subagent.")(task)
    build_tools = agents_module.build_tools
    monkeypatch.setattr(agents_module, "build_tools", lambda *a, **k: [*build_tools(*a, **k), quick])
    monkeypatch.setattr(agents_module, "_delegates", lambda tools: False)
    script = [DELEGATE[0], turn("Reading the result.", delay_ms=60_000)]
    config = keel.config({"delegate": script})
    thread = new_thread_id("deleg")
    async with keel.open(config) as rt:
        run = await start(rt, thread, "analyse the paper")

        async def result_checkpointed() -> bool:
            try:
                values = (await thread_state(rt, thread)).values or {}
            except AssertionError:  # no checkpoint yet
                return False
            return any(getattr(m, "tool_call_id", None) == "call-sub" for m in values.get("messages") or [])

        await wait_until(result_checkpointed, what="the task result in the thread")
        assert (await _ledger(rt, thread))["call-sub"]["status"] == "in_progress"  # not read yet
        assert await rt.manager.cancel(run.run_id) == CancelOutcome.cancelled
        assert (await finished(rt, run.run_id)).status == RunStatus.interrupted
        assert (await _ledger(rt, thread))["call-sub"]["status"] == "completed"
