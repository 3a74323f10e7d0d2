"""Subagents share their thread's workspace, and each change is attributed to the agent that made it;
a subagent delegates further only when its type allows it, and never deeper than that."""

from __future__ import annotations

from runtime_support import Keel, _param, backend_matrix, call, finished, journal, new_thread_id, start, turn

from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix([_param("memory", "memory"), _param("sqlite", "memory")])


def task(call_id: str, subagent_type: str = "general-purpose", prompt: str = "Do it.") -> dict[str, object]:
    return call("task", call_id, description=f"job {call_id}", prompt=prompt, subagent_type=subagent_type)


async def test_each_file_change_names_the_agent_that_made_it(keel: Keel) -> None:
    lead = [
        turn("Delegating.", task("t1")),
        turn("My own part.", call("write_file", "w-lead", path="/workspace/outputs/lead.md", content="# Lead\n")),
        turn("Both parts are written."),
    ]
    child = [
        turn("Writing.", call("write_file", path="/workspace/outputs/child.md", content="# Child\n")),
        turn("Wrote /workspace/outputs/child.md."),
    ]
    config = keel.config({"m": {"lead": lead, "general-purpose": child}})
    async with keel.open(config) as rt:
        record = await finished(rt, (await start(rt, new_thread_id("attr"), "go")).run_id, timeout=30)
        events = await journal(rt, record.run_id)
    assert record.status is RunStatus.success, record.error
    changed = {e.data["path"]: e.data for e in events if e.kind == "file.changed"}
    assert changed["/workspace/outputs/child.md"]["agent"] == "subagent:general-purpose/t1"
    assert changed["/workspace/outputs/lead.md"]["agent"] == "lead"
    assert [s["agent"] for s in changed["/workspace/outputs/child.md"]["steps"]] == ["subagent:general-purpose/t1"]
    (end,) = [e for e in events if e.kind == "subagent.end"]
    assert end.data["files_changed"] == ["/workspace/outputs/child.md"]
    assert end.data["status"] == "completed" and end.data["stop_reasons"] == []
    assert end.data["usage"]["calls"] == 2  # the child's own two model calls, counted on their own
    assert end.caller == "subagent:general-purpose"


async def test_delegation_depth_is_bounded_by_the_type(keel: Keel) -> None:
    lead = [turn("Delegating the plan.", task("p1", "planner")), turn("Planned.")]
    planner = [turn("Splitting.", task("g1")), turn("Split done.")]
    general = [turn("Nesting further.", task("x1")), turn("Could not delegate; did it myself.")]
    config = keel.config(
        {"m": {"lead": lead, "planner": planner, "general-purpose": general}},
        subagents={"types": [{"name": "planner", "description": "Plans", "delegation_depth": 1}]},
    )
    async with keel.open(config) as rt:
        record = await finished(rt, (await start(rt, new_thread_id("depth"), "go")).run_id, timeout=30)
        events = await journal(rt, record.run_id)
    assert record.status is RunStatus.success, record.error
    starts = {e.data["task_id"]: e.data for e in events if e.kind == "subagent.start"}
    assert {k: v["depth"] for k, v in starts.items()} == {"p1": 1, "g1": 2}  # x1 never started
    ends = {e.data["task_id"]: e.data for e in events if e.kind == "subagent.end"}
    assert ends["g1"]["status"] == "completed" and ends["p1"]["status"] == "completed"
    # The general-purpose child (no delegation depth) has no task tool: its call got an error
    # result, and it went on with the subtask itself.
    assert ends["g1"]["brief"] == "Could not delegate; did it myself."
