"""DeerFlow's "analyze this paper" run, replayed: three batches of three overlapping delegations.

There, nothing durable recorded which subtasks were already delegated, so after summarization
every planning step looked like a fresh task and the lead dispatched the same research three
times (~9.9M tokens). Here the delegation ledger is a state channel: after each compaction takes
a batch's messages out of what the model is sent, the ledger still lists it (the script's
``expect:`` checks every planning request), and the per-run cap counted from that ledger strips
the third batch before it runs (``subagent_limit_capped``): only six children ever start.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage
from runtime_support import (
    LIGHT_MATRIX,
    Keel,
    backend_matrix,
    call,
    finished,
    journal,
    lead_requests,
    new_thread_id,
    start,
    thread_state,
    turn,
)

from agentkeel.harness.durable import durable_values
from agentkeel.harness.projection import DATA_ID
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)

TOPICS = ("academic", "industry", "theory")


def batch(n: int, expect: str | None = None) -> dict[str, Any]:
    calls = [
        call("task", f"t{3 * (n - 1) + i + 1}", description=f"{topic} view of the paper (LEDGER-{n})",
             prompt=f"Research the {topic} view of the paper.", subagent_type="general-purpose")
        for i, topic in enumerate(TOPICS)
    ]
    extra: dict[str, Any] = {"expect": {"contains": expect}} if expect else {}
    return turn(f"Dispatching batch {n}.", *calls, **extra)


LEAD = [
    batch(1),
    turn("Checking notes.", call("ls", path="/workspace")),
    turn("Checking notes again.", call("ls", path="/workspace")),
    batch(2, expect="LEDGER-1"),  # batch 1's messages are compacted by now: only the ledger has it
    turn("Checking notes.", call("ls", path="/workspace")),
    turn("Checking notes again.", call("ls", path="/workspace")),
    batch(3, expect="LEDGER-2"),
    turn("The report, from the six results."),
]
CHILD = [turn("Findings: three facts with sources.")]


async def test_three_overlapping_batches_across_compaction_run_only_six_children(
    keel: Keel, sent: list[tuple[str, list[BaseMessage]]],
) -> None:
    config = keel.config(
        {"paper": {"lead": LEAD, "general-purpose": CHILD, "summarization": [turn("Summary of the work so far.")]}},
        limits={"summarization": {"enabled": True, "trigger_messages": 8, "keep_messages": 3}},
        subagents={"max_concurrent": 3, "max_per_run": 6},
    )
    thread = new_thread_id("paper")
    async with keel.open(config) as rt:
        record = await finished(rt, (await start(rt, thread, "Analyze this paper.")).run_id, timeout=60)
        events = await journal(rt, record.run_id)
        values = (await thread_state(rt, thread)).values

    assert record.status is RunStatus.success, record.error
    # The script's ``expect:`` made every planning request after the first batch prove it listed
    # what was already delegated (a miss fails the run); after a compaction it comes from the
    # ledger in the durable-context data message and nowhere else.
    compacted = [r for r in lead_requests(sent) if any(m.id == DATA_ID for m in r)]
    assert compacted, "the thread was never compacted: the replay proves nothing"
    for request in compacted:
        holders = {m.id for m in request if "LEDGER-1" in m.text}
        assert holders == {DATA_ID}, holders

    # The third batch was stripped before it ran: six children, no more.
    starts = [e for e in events if e.kind == "subagent.start"]
    assert sorted(e.data["task_id"] for e in starts) == [f"t{i}" for i in range(1, 7)]
    capped = [r for r in record.stop_reasons if r["code"] == "subagent_limit_capped"]
    assert len(capped) == 1 and capped[0]["source"] == "SubagentLimit"
    ledger = durable_values(values)["delegations"]
    assert [(e["id"], e["status"]) for e in ledger] == [(f"t{i}", "completed") for i in range(1, 7)]
    assert [agent for agent, _ in sent].count("general-purpose") == 6
