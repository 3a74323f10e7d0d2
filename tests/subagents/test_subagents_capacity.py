"""How many children run, in which order, and how one child's end leaves its siblings.

Measured from the journal, not from the executor's counters: ``subagent.start`` / ``subagent.end``
records are ordered by the run's sequence, so the most children in flight at once is the peak of
(+1 per start, -1 per end). Children take real (event-loop) time with ``delay_ms``, so they would
overlap if nothing held them back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runtime_support import Keel, call, finished, journal, run_to_end, start, thread_messages, turn, wait_until
from subagent_support import (
    GP,
    LEAD_ANSWER,
    delegating_lead,
    ends_by_task,
    last_answer,
    max_overlap,
    of_kind,
    outcome_of,
    task_call,
    task_results,
)

from agentkeel.runtime.records import RunStatus


def slow_child(delay_ms: int) -> list[dict[str, Any]]:
    return [turn("Sentence {instance} written.", delay_ms=delay_ms, usage=(100, 10))]


async def test_max_concurrent_bounds_the_children_in_flight(keel: Keel) -> None:
    topics = ("a", "b", "c", "d")
    config = keel.config({"m": {"lead": delegating_lead(topics), GP: slow_child(300)}},
                         subagents={"max_concurrent": 2})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, "t-conc", "Four sentences.")
        events = await journal(rt, record.run_id)
    assert record.status == RunStatus.success
    started = of_kind(events, "subagent.start")
    assert len(started) >= 2 and set(ends_by_task(events)) == {e.data["task_id"] for e in started}
    assert max_overlap(events) == 2  # they did overlap, and never more than two


def one_task_lead(subagent_type: str) -> list[dict[str, Any]]:
    return [turn("Delegating.", task_call("One sentence", "Write one sentence.", subagent_type)), turn(LEAD_ANSWER)]


async def test_process_capacity_queues_children_fifo_and_their_clock_starts_when_they_run(keel: Keel) -> None:
    """Three runs, one slot. The first run's child holds it for ``hold_s``; the other two children
    (limit ``timeout_s``, shorter than that) queue and run one after the other in the order they
    asked. Each waited longer than its own limit and still completed: its clock starts when it runs."""
    hold_s, quick_s, timeout_s = 3.0, 0.3, 1.0
    assert quick_s < timeout_s < hold_s
    config = keel.config(
        {"holds": {"lead": one_task_lead("holder"), "holder": slow_child(int(hold_s * 1000))},
         "queues": {"lead": one_task_lead("quick"), "quick": slow_child(int(quick_s * 1000))}},
        subagents={"process_capacity": 1, "types": [{"name": "holder"}, {"name": "quick", "timeout_s": timeout_s}]},
    )
    async with keel.open(config) as rt:
        capacity = rt.harness.subagent_capacity
        runs = []
        for index, (thread, model) in enumerate((("t-q0", "holds"), ("t-q1", "queues"), ("t-q2", "queues"))):
            runs.append(await start(rt, thread, "One sentence.", model_name=model))
            await wait_until(lambda n=index: capacity.running + capacity.waiting == n + 1, timeout=10,
                             what=f"child {index} to hold or wait for the slot")
        records = [await finished(rt, r.run_id, timeout=30) for r in runs]
        journals = [await journal(rt, r.run_id) for r in records]
        outcomes = [outcome_of(next(iter(task_results(await thread_messages(rt, r.thread_id)).values())))
                    for r in records]
    assert [r.status for r in records] == [RunStatus.success] * 3
    assert [o["status"] for o in outcomes] == ["completed"] * 3
    starts = [of_kind(j, "subagent.start")[0] for j in journals]
    ends = [of_kind(j, "subagent.end")[0] for j in journals]
    # FIFO, one at a time: each child starts after the previous one ended.
    for previous_end, next_start in zip(ends, starts[1:]):
        assert previous_end.ts is not None and next_start.ts is not None and previous_end.ts <= next_start.ts
    for start_event, outcome in zip(starts[1:], outcomes[1:]):
        # From its request to its end it took longer than its limit; its own clock did not.
        assert start_event.data["queued_s"] + outcome["duration_s"] > timeout_s > outcome["duration_s"]


async def test_a_failing_child_fails_alone_and_its_siblings_complete(keel: Keel) -> None:
    lead = [turn("Delegating.", task_call("First", "Write one sentence.", GP),
                 task_call("Broken", "Write one sentence.", "flaky"),
                 task_call("Second", "Write one sentence.", GP)),
            turn(LEAD_ANSWER)]
    flaky = [{"raise": {"kind": "bad_request", "message": "the provider refused the request"}, "delay_ms": 100}]
    config = keel.config({"m": {"lead": lead, GP: slow_child(600), "flaky": flaky}},
                         subagents={"types": [{"name": "flaky", "description": "Fails."}]},
                         limits={"llm_retry": {"max_attempts": 1}})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, "t-fail", "Three sentences.")
        messages = await thread_messages(rt, "t-fail")
    assert record.status == RunStatus.success, record.error
    by_type: dict[str, list[dict[str, Any]]] = {}
    for message in task_results(messages).values():
        data = outcome_of(message)
        by_type.setdefault(data["subagent_type"], []).append(data)
    assert [d["status"] for d in by_type["flaky"]] == ["failed"]
    assert by_type["flaky"][0]["error"]
    assert [d["status"] for d in by_type[GP]] == ["completed", "completed"]
    assert all(d["brief"].startswith("Sentence ") for d in by_type[GP])
    assert last_answer(messages) == LEAD_ANSWER


async def test_a_child_past_its_time_limit_ends_timed_out_with_its_partial_output(keel: Keel) -> None:
    slow = [turn("Partial finding: the river is long.", call("ls", path="/workspace"), usage=(100, 10)),
            turn("Never said.", delay_ms=30_000)]
    lead = [turn("Delegating.", task_call("Slow research", "Research the river.", "slow")), turn(LEAD_ANSWER)]
    config = keel.config({"m": {"lead": lead, "slow": slow}},
                         subagents={"types": [{"name": "slow", "timeout_s": 0.5}]})
    async with keel.open(config) as rt:
        began = asyncio.get_running_loop().time()
        record = await run_to_end(rt, "t-slow", "Research.")
        elapsed = asyncio.get_running_loop().time() - began
        messages = await thread_messages(rt, "t-slow")
    (message,) = task_results(messages).values()
    data = outcome_of(message)
    assert data["status"] == "timed_out" and "time limit of 0.5 s" in data["error"]
    assert data["brief"] == "Partial finding: the river is long."
    assert "Partial result:\nPartial finding" in message.text
    assert 0.5 <= data["duration_s"] < 5 and elapsed < 15
    assert record.status == RunStatus.success and last_answer(messages) == LEAD_ANSWER
