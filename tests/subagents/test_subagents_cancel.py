"""Cancelling a run while its children work: they stop with it, and what they did is kept.

A child runs inside its parent's tool step on the run's task, so the run's cancellation reaches
it with nothing forwarded. What is checked is what must be true afterwards: the run is
``interrupted``, no child is still running (no executor frame left on the loop, the process
capacity is free, no model call journaled after the children settled, nothing written later), each
child's end is journaled ``cancelled`` with its partial answer, and the thread's ledger closes each
delegation ``cancelled`` with that answer as its brief.
"""

from __future__ import annotations

import asyncio
import hashlib

from runtime_support import Keel, call, finished, journal, start, thread_messages, turn, wait_until
from subagent_support import (
    GP,
    TOPICS,
    child_tasks,
    delegating_lead,
    ends_by_task,
    ledger,
    of_kind,
    outcome_of,
    task_call,
    task_results,
)

from agentkeel.runtime.manager import CancelOutcome
from agentkeel.runtime.records import RunStatus

DELAY_MS = 250  # each child turn; the run is cancelled while several are in flight


def working_child() -> list[dict[str, object]]:
    """A child that keeps working (a new file each turn: no guard stops it soon) and says so each turn."""
    write = call("write_file", path="/workspace/outputs/part{instance}-{turn}.md", content="Draft {turn}.\n")
    return [turn("Part {instance}: drafted step {turn}.", write,
                 delay_ms=DELAY_MS, usage=(200, 20), repeat="forever")]


async def test_cancelling_the_parent_stops_every_child_and_keeps_their_partial_output(keel: Keel) -> None:
    config = keel.config({"work": {"lead": delegating_lead(), GP: working_child()}})
    async with keel.open(config) as rt:
        run = await start(rt, "t-cancel", "Write three sentences, one per subagent.")

        async def children_answered() -> bool:
            # A child's tool call ran: its first answer (with text) is in the child's state.
            ran = {e.data.get("call_id") for e in of_kind(await journal(rt, run.run_id), "tool.call")}
            return all(any(f"-{GP}-{i}-" in str(c) for c in ran) for i in range(len(TOPICS)))

        await wait_until(children_answered, timeout=15, what="every child to have run a tool")
        assert rt.harness.subagent_capacity.running == len(TOPICS)
        assert child_tasks(), "the children's tasks are visible while they run"
        assert await rt.manager.cancel(run.run_id) == CancelOutcome.cancelled
        record = await finished(rt, run.run_id)
        assert record.status == RunStatus.interrupted
        assert child_tasks() == []
        assert (rt.harness.subagent_capacity.running, rt.harness.subagent_capacity.waiting) == (0, 0)
        settled = await journal(rt, run.run_id)
        await asyncio.sleep(3 * DELAY_MS / 1000)  # a child still running would have called its model again
        later = await journal(rt, run.run_id)
        entries = await ledger(rt, "t-cancel")

    assert [e.seq for e in later] == [e.seq for e in settled]
    ends = ends_by_task(later)
    assert len(ends) == len(TOPICS)
    # The cancel reached every child at once: once the first one settled, no child's model answered.
    first_end = min(e.seq for e in of_kind(later, "subagent.end"))
    assert [e.seq for e in of_kind(later, "model.call") if e.seq > first_end] == []
    assert [e.data["code"] for e in of_kind(later, "stop_reason")] == ["cancelled"]
    for task_id, data in ends.items():
        assert data["status"] == "cancelled" and data["error"] == "the delegating run was stopped"
        assert data["brief"].startswith("Part ") and "drafted step" in data["brief"]
        assert data["sha256"] == hashlib.sha256(data["brief"].encode()).hexdigest()
        assert data["usage"]["calls"] >= 1
        entry = entries[task_id]
        assert (entry["status"], entry["run_id"]) == ("cancelled", run.run_id)
        assert entry["stop_reason"] == "the run was stopped before the delegation finished"
        assert entry["result_brief"] == data["brief"] and entry["result_sha256"] == data["sha256"]


async def test_a_run_that_hits_its_time_limit_closes_its_childrens_delegations_timed_out(keel: Keel) -> None:
    """The children are cancelled with the run (their own outcome says so); the ledger says why
    the work stopped — the run's time limit — and keeps each child's partial answer."""
    config = keel.config({"work": {"lead": delegating_lead(), GP: working_child()}})
    async with keel.open(config) as rt:
        run = await start(rt, "t-run-timeout", "Write three sentences, one per subagent.", timeout_s=3.0)
        record = await finished(rt, run.run_id)
        ends = ends_by_task(await journal(rt, run.run_id))
        entries = await ledger(rt, "t-run-timeout")
        assert child_tasks() == [] and rt.harness.subagent_capacity.running == 0
    assert record.status == RunStatus.timeout
    assert len(ends) == len(TOPICS) and {d["status"] for d in ends.values()} == {"cancelled"}
    for task_id, data in ends.items():
        entry = entries[task_id]
        assert (entry["status"], entry["stop_reason"]) == ("timed_out", "the run hit its time limit before the delegation finished")
        assert entry["result_brief"] == data["brief"] and data["brief"].startswith("Part ")


async def test_cancelling_a_run_whose_child_waits_for_the_process_capacity(keel: Keel) -> None:
    """The queued child gives up its place (it never started), the running one of the other run
    is untouched, and the cancelled run's delegation is closed ``cancelled`` all the same."""
    lead = [turn("Delegating.", task_call("One sentence", "Write one sentence.")), turn("Done.")]
    config = keel.config({"m": {"lead": lead, GP: [turn("Written.", delay_ms=4000)]}},
                         subagents={"process_capacity": 1})
    async with keel.open(config) as rt:
        capacity = rt.harness.subagent_capacity
        holder = await start(rt, "t-hold", "One sentence.")
        await wait_until(lambda: capacity.running == 1, what="the first child to run")
        queued = await start(rt, "t-queued", "One sentence.")
        await wait_until(lambda: capacity.waiting == 1, what="the second child to queue")
        assert await rt.manager.cancel(queued.run_id) == CancelOutcome.cancelled
        cancelled = await finished(rt, queued.run_id)
        assert (capacity.running, capacity.waiting) == (1, 0)  # the holder still runs, nobody waits
        done = await finished(rt, holder.run_id)
        events = await journal(rt, queued.run_id)
        entries = await ledger(rt, "t-queued")
        held = await thread_messages(rt, "t-hold")
    assert (cancelled.status, done.status) == (RunStatus.interrupted, RunStatus.success)
    assert of_kind(events, "subagent.start") == []
    (end,) = ends_by_task(events).values()
    assert end["status"] == "cancelled" and end["usage"]["calls"] == 0
    assert entries[end["task_id"]]["status"] == "cancelled"
    assert [outcome_of(m)["status"] for m in task_results(held).values()] == ["completed"]
    assert capacity.running == 0
