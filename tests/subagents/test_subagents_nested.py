"""A subagent that delegates in turn: each level's calls are counted as its own.

A grandchild's calls carry two ``subagent:*`` tags, and LangChain's config merge sorts tags, so
their order says nothing about which is innermost. The type names here are chosen so that the
sorted order is wrong (``general-purpose`` < ``planner``): the grandchild's calls must still be
journaled and counted as ``subagent:general-purpose``, and the planner's as its own.
"""

from __future__ import annotations

from runtime_support import Keel, journal, run_to_end, thread_messages, turn
from subagent_support import GP, LEAD_ANSWER, last_answer, of_kind, outcome_of, runaway_child, task_call, task_results

from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.timeline import load_timeline

PLANNER = "planner"


async def test_a_grandchilds_calls_are_its_own_not_its_delegating_subagents(keel: Keel) -> None:
    assert sorted([f"subagent:{GP}", f"subagent:{PLANNER}"])[-1] == f"subagent:{PLANNER}"  # the trap
    lead = [turn("Delegating.", task_call("Plan", "Plan and delegate the sentence.", PLANNER)), turn(LEAD_ANSWER)]
    planner = [turn("Delegating the sentence.", task_call("Sentence", "Write one sentence.", GP), usage=(100, 10)),
               turn("Planned; the sentence was delegated.", usage=(100, 10))]
    config = keel.config({"m": {"lead": lead, PLANNER: planner, GP: runaway_child()}},
                         subagents={"types": [{"name": PLANNER, "delegation_depth": 1}]})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, "t-nested", "One planned sentence.")
        events = await journal(rt, record.run_id)
        messages = await thread_messages(rt, "t-nested")
        timeline = await load_timeline(rt, record.run_id)
    assert record.status == RunStatus.success and last_answer(messages) == LEAD_ANSWER
    (planned,) = [outcome_of(m) for m in task_results(messages).values()]
    assert planned["status"] == "completed" and planned["usage"]["calls"] == len(planner)

    calls = [e.caller for e in of_kind(events, "model.call")]
    assert calls.count(f"subagent:{PLANNER}") == len(planner)
    grandchild_calls = calls.count(f"subagent:{GP}")
    assert grandchild_calls >= 2
    writes = {e.caller for e in of_kind(events, "tool.call") if e.data.get("name") == "write_file"}
    assert writes == {f"subagent:{GP}"}
    by_agent = record.usage["by_agent"]
    assert by_agent[f"subagent:{PLANNER}"]["calls"] == len(planner)
    assert by_agent[f"subagent:{GP}"]["calls"] == grandchild_calls
    # The grandchild was stopped by the loop guard; the planner's outcome says who.
    (reason,) = planned["stop_reasons"]
    assert reason["code"] == "loop_capped" and reason["source"].startswith(f"subagent:{GP}/")
    assert "loop_capped" in {r["code"] for r in record.stop_reasons}
    # keel replay's timeline: the grandchild under the planner that delegated it, each with its own calls
    assert timeline is not None and timeline.divergences == [], timeline.divergences
    (planner_item,) = [i for i in timeline.items if i.kind == "subagent.start"]
    (grandchild,) = [i for i in planner_item.children if i.kind == "subagent.start"]
    assert planner_item.data["subagent_type"] == PLANNER and grandchild.data["subagent_type"] == GP
    assert grandchild.data["parent_task_id"] == planner_item.data["task_id"]
    assert {c.caller for c in grandchild.children if c.kind == "model.call"} == {f"subagent:{GP}"}
    assert {c.caller for c in planner_item.children if c.kind == "model.call"} == {f"subagent:{PLANNER}"}
