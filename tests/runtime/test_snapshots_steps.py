"""A file changed by several tool calls lists each of them in its ``file.changed`` record."""

from __future__ import annotations

from runtime_support import (
    LIGHT_MATRIX,
    UNGATED,
    Keel,
    backend_matrix,
    call,
    journal,
    new_thread_id,
    run_to_end,
    sha256,
    turn,
)

from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)

DRAFT = "# Plan\nstatus: draft\n"
FINAL = "# Plan\nstatus: final\n"
SCRIPT = [
    turn(None, call("write_file", "call_w", path="/workspace/plan.md", content=DRAFT)),
    turn(None, call("str_replace", "call_s", path="/workspace/plan.md", old="draft", new="final")),
    turn("Done."),
]


async def test_created_then_edited_file_credits_both_steps_in_order(keel: Keel) -> None:
    config = keel.config({"scripted-m": SCRIPT}, limits=UNGATED)
    async with keel.open(config) as rt:
        record = await run_to_end(rt, new_thread_id("steps"), "Plan it.")
        assert record.status == RunStatus.success, record.error
        events = await journal(rt, record.run_id)
    tool_seq = {e.data["call_id"]: e.seq for e in events if e.kind == "tool.call"}
    (change,) = [e.data for e in events if e.kind == "file.changed"]
    assert (change["change"], change["before_sha256"], change["after_sha256"]) == ("added", None, sha256(FINAL))
    # The last step stays the headline (unchanged fields); every step is listed with its hashes.
    assert (change["tool_call_id"], change["tool_name"], change["tool_seq"]) == ("call_s", "str_replace", tool_seq["call_s"])
    assert change["steps"] == [
        {"tool_call_id": "call_w", "tool_name": "write_file", "agent": "lead", "tool_seq": tool_seq["call_w"],
         "before_sha256": None, "after_sha256": sha256(DRAFT)},
        {"tool_call_id": "call_s", "tool_name": "str_replace", "agent": "lead", "tool_seq": tool_seq["call_s"],
         "before_sha256": sha256(DRAFT), "after_sha256": sha256(FINAL)},
    ]
