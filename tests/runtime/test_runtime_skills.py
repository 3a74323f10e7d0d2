"""Skills end to end: a scripted lead, run by the worker through the Harness and its guard chain,
sees the skills listed in its prompt, reads a SKILL.md at /skills, cannot write there, and the read
is still recognisable as a skill read in the checkpointed thread."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from runtime_support import LIGHT_MATRIX, Keel, backend_matrix, call, new_thread_id, run_to_end, thread_messages, turn
from runtime_support import workspace as thread_workspace

from agentkeel.harness.middleware.keys import READ_MARK
from agentkeel.harness.skills import skill_read
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)

SKILL = "---\nname: pdf\ndescription: Fill in and merge PDF forms.\n---\nUse pdftk; never edit the original.\n"

LEAD = [
    turn(
        "A PDF task: reading the skill first.",
        call("read_file", "c-read", path="/skills/pdf/SKILL.md"),
        expect={"contains": "- pdf: Fill in and merge PDF forms. (/skills/pdf/SKILL.md)"},
    ),
    turn(
        "Following it.",
        call("write_file", "c-skill", path="/skills/pdf/SKILL.md", content="edited"),
        call("write_file", "c-out", path="/workspace/outputs/merged.md", content="merged\n"),
        expect={"contains": "Use pdftk; never edit the original."},
    ),
    turn("Done: merged.", expect={"contains": "/skills is read-only"}),
]


@pytest.mark.parametrize("mode", ["full", "delta"])
async def test_a_run_reads_a_skill_from_the_prompt_listing(keel: Keel, tmp_path: Path, mode: str) -> None:
    skill = tmp_path / "skills" / "pdf" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(SKILL)
    config = keel.config({"lead": LEAD}, skills_dir="skills", checkpoint_mode=mode)
    thread = new_thread_id("skills")
    async with keel.open(config) as rt:
        record = await run_to_end(rt, thread, "Merge the two PDFs.")
        assert record.status == RunStatus.success, record.error
        messages = await thread_messages(rt, thread)
    assert messages[-1].content == "Done: merged."
    calls = {c["id"]: c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    assert results["c-read"].content == SKILL
    assert READ_MARK not in results["c-read"].additional_kwargs  # nothing can write there: no mark needed
    read = skill_read("read_file", calls["c-read"]["args"], results["c-read"])  # after the checkpoint round trip
    assert read is not None and (read.name, read.path) == ("pdf", "/skills/pdf/SKILL.md")
    assert read.body == "Use pdftk; never edit the original.\n"
    assert results["c-skill"].status == "error" and "/skills is read-only" in str(results["c-skill"].content)
    assert skill_read("write_file", calls["c-skill"]["args"], results["c-skill"]) is None
    assert skill.read_text() == SKILL
    assert (thread_workspace(config, thread) / "outputs" / "merged.md").read_text() == "merged\n"
