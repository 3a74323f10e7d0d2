"""A run's children from a real delegation (the scripted lead and subagents through the executor):
the ledger lists each child as the executor journaled it, and renders the table and the agents."""

from __future__ import annotations

import io

from rich.console import Console
from runtime_support import Keel, _param, backend_matrix, call, finished, new_thread_id, start, turn

from agentkeel.cli.render import render_ledger
from agentkeel.runtime.children import run_children
from agentkeel.runtime.ledger import build_ledger
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix([_param("memory", "memory"), _param("sqlite", "memory")])


def task(call_id: str, subagent_type: str) -> dict[str, object]:
    return call("task", call_id, description=f"job {call_id}", prompt="Do it.", subagent_type=subagent_type)


async def test_the_ledger_lists_each_delegated_child(keel: Keel) -> None:
    lead = [turn("Delegating.", task("w1", "general-purpose"), task("s1", "short")), turn("Both are back.")]
    writer = [
        turn("Writing.", call("write_file", path="/workspace/outputs/child.md", content="# Child\n")),
        turn("Wrote /workspace/outputs/child.md."),
    ]
    short = [turn("Looking.", call("ls", path="/workspace")), turn("Never reached.")]
    config = keel.config(
        {"m": {"lead": lead, "general-purpose": writer, "short": short}},
        subagents={"types": [{"name": "short", "description": "One turn only", "max_turns": 1}]},
    )
    async with keel.open(config) as rt:
        record = await finished(rt, (await start(rt, new_thread_id("kids"), "go")).run_id, timeout=30)
        ledger = await build_ledger(record, rt.journal, rt.checkpointer)
        assert await run_children(rt.journal, record) == ledger["subagents"]
    assert record.status is RunStatus.success, record.error
    children = {c["task_id"]: c for c in ledger["subagents"]}
    assert set(children) == {"w1", "s1"}
    assert [c["seq"] for c in ledger["subagents"]] == sorted(c["seq"] for c in ledger["subagents"])
    written, capped = children["w1"], children["s1"]
    assert written["status"] == "completed" and written["stop_reasons"] == [] and written["depth"] == 1
    assert written["files_changed"] == ["/workspace/outputs/child.md"] and written["usage"]["calls"] == 2
    assert written["brief"] == "Wrote /workspace/outputs/child.md." and written["subagent_type"] == "general-purpose"
    assert capped["stop_reason"] == "turn_capped" and capped["files_changed"] == []
    # the child's reason is also the parent's, sourced to the child
    assert any(r["source"] == "subagent:short/s1" and r["code"] == "turn_capped" for r in ledger["stop_reasons"])

    out = io.StringIO()
    render_ledger(Console(file=out, width=220, color_system=None), ledger)
    text = out.getvalue()
    table = text[text.index("Subagents"):text.index("Which step changed which file?")]
    assert "(2 started)" in table and "turn_capped" in table and "outputs/child.md" in table
    files = text[text.index("Which step changed which file?"):]
    assert "subagent:general-purpose/w1" in files
