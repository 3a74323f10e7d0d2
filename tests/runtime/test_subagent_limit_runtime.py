"""SubagentLimit on a real run with real subagents: a response's excess task calls and the run's
calls past its budget never start a child, and the run records why."""

from __future__ import annotations

from runtime_support import Keel, _param, backend_matrix, call, finished, journal, new_thread_id, start, turn

from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix([_param("memory", "memory")])


def task(call_id: str) -> dict[str, object]:
    return call("task", call_id, description=f"job {call_id}", prompt="Do it.", subagent_type="general-purpose")


async def test_only_the_calls_within_both_bounds_start_a_subagent(keel: Keel) -> None:
    lead = [
        turn("Three at once.", task("t1"), task("t2"), task("t3")),  # max_concurrent 2: t3 dropped
        turn("Two more.", task("t4"), task("t5")),  # 2 of max_per_run 3 made: t5 dropped
        turn("Here is the summary."),
    ]
    child = [{"say": "Child done.", "repeat": "forever"}]
    config = keel.config({"m": {"lead": lead, "general-purpose": child}},
                         subagents={"max_concurrent": 2, "max_per_run": 3})
    async with keel.open(config) as rt:
        record = await finished(rt, (await start(rt, new_thread_id("limit"), "go")).run_id, timeout=30)
        events = await journal(rt, record.run_id)
    assert record.status is RunStatus.success, record.error
    assert sorted(e.data["task_id"] for e in events if e.kind == "subagent.start") == ["t1", "t2", "t4"]
    [capped] = [r for r in record.stop_reasons if r["code"] == "subagent_limit_capped"]
    assert capped["data"] == {"dropped": ["t3"], "kept": 2, "max_concurrent": 2, "max_per_run": 3, "prior": 0}
    drops = [e.data for e in events if e.kind == "intervention" and e.data.get("middleware") == "SubagentLimit"]
    assert [d["dropped"] for d in drops] == [["t3"], ["t5"]]
