"""A re-run answers its tool calls from the recording: the tools are not executed, and a call the
recording does not hold fails the run loudly (``runtime/tool_replay.py``).

The tools have an effect outside the workspace — a ``bash`` command (unsandboxed) appending a line
to a counter file beside the data directory — so "not executed" is a fact the test can read. The
lead and a subagent both run one; the re-run's journal (files aside) and final state must equal the
recording's, and the counter must not move. A ``write_file`` (an effect inside the workspace) runs
in the re-run's own workspace, so its files match too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from runtime_support import (
    Keel,
    _param,
    backend_matrix,
    call,
    journal,
    new_thread_id,
    run_to_end,
    thread_messages,
    turn,
    workspace,
)

from agentkeel.config import KeelConfig
from agentkeel.harness.tools import shell
from agentkeel.runtime import journal_callbacks
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.replay import (
    compare,
    final_state,
    journal_signature,
    offline_config,
    recorded_tools,
    replay_and_compare,
    rerun,
)
from agentkeel.runtime.script_export import export_script
from agentkeel.runtime.tool_replay import RecordedTools

pytestmark = backend_matrix([_param("sqlite", "memory"), _param("postgres", "redis")])

GP = "general-purpose"


def counting_config(keel: Keel, counter: Path) -> KeelConfig:
    lead = call("bash", command=f"echo lead >> {counter} && wc -l < {counter}")
    child = call("bash", command=f"echo child >> {counter} && echo counted")
    script: dict[str, Any] = {
        "lead": [
            turn("Counting.", lead),
            turn("Noting.", call("write_file", path="/workspace/outputs/note.md", content="counted\n")),
            turn("Delegating.", call("task", description="Count", prompt="Count once", subagent_type=GP)),
            turn("Counted twice."),
        ],
        GP: [turn(None, child), turn("Counted.")],
    }
    return keel.config({"rec": script}, tools={"bash": True, "bash_unsandboxed": True},
                       limits={"read_before_write": {"enabled": False}})


async def record(keel: Keel, config: KeelConfig, tmp_path: Path) -> tuple[RunRecord, Path]:
    async with keel.open(config) as rt:
        original = await run_to_end(rt, new_thread_id("count"), "Count twice.")
        script = export_script(await journal(rt, original.run_id), await thread_messages(rt, original.thread_id))
    assert original.status == RunStatus.success, original.error
    path = tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump(script, sort_keys=False))
    return original, path


async def replay(keel: Keel, config: KeelConfig, original: RunRecord,
                 script: Path) -> tuple[RunRecord, RecordedTools, list[str]]:
    """Re-run ``original`` from ``script`` with its tools answered from the recording; the
    differences of journal and final state."""
    async with keel.open(offline_config(config, script)) as rt:
        tools = await recorded_tools(rt, original)
        expected = journal_signature(await journal(rt, original.run_id), original), await final_state(rt, original)
        replayed = await rerun(rt, original, tools=tools)
        actual = (journal_signature(await journal(rt, replayed.run_id), replayed, original),
                  await final_state(rt, replayed, original))
    return replayed, tools, compare(expected[0], actual[0]) + compare(expected[1], actual[1])


async def test_a_rerun_answers_every_tool_call_from_the_recording(keel: Keel, tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    config = counting_config(keel, counter)
    original, script = await record(keel, config, tmp_path)
    assert counter.read_text() == "lead\nchild\n"

    replayed, tools, differences = await replay(keel, config, original, script)
    assert replayed.status == RunStatus.success, replayed.error
    assert counter.read_text() == "lead\nchild\n"  # neither bash call ran again
    assert differences == []  # files included: the write_file ran in the re-run's workspace
    ((label, why),) = tools.live
    assert tools.misses == [] and "write_file" in label and "workspace" in why
    assert [line.split(" #")[0] for line in tools.answered] == ["lead", next(iter(set(tools.calls) - {"lead"}))]
    async with keel.open(config) as rt:  # the lead's recorded count (1, not a live 3) reached the model
        messages = await thread_messages(rt, replayed.thread_id)
    assert [m.text.splitlines()[0] for m in messages if m.type == "tool"][0] == "1"


async def test_a_changed_tool_argument_fails_the_rerun_loudly(keel: Keel, tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    config = counting_config(keel, counter)
    original, script = await record(keel, config, tmp_path)
    data = yaml.safe_load(script.read_text())
    data["agents"]["lead"][0]["tool_calls"][0]["args"]["command"] = f"echo other >> {counter}"
    script.write_text(yaml.safe_dump(data, sort_keys=False))

    replayed, tools, _ = await replay(keel, config, original, script)
    assert replayed.status == RunStatus.error and "ToolReplayMiss" in (replayed.error or ""), replayed.error
    assert "bash" in (replayed.error or "") and "expected recorded call #1" in (replayed.error or "")
    assert counter.read_text() == "lead\nchild\n"  # the changed call never ran
    (miss,) = tools.misses
    assert "agent lead" in miss and "echo other" in miss and "echo lead" in miss


async def test_a_changed_subagent_call_fails_the_whole_run(keel: Keel, tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    config = counting_config(keel, counter)
    original, script = await record(keel, config, tmp_path)
    data = yaml.safe_load(script.read_text())
    (child,) = [k for k in data["agents"] if k.startswith(f"{GP}@")]
    data["agents"][child][0]["tool_calls"][0]["args"]["command"] = "echo elsewhere"
    script.write_text(yaml.safe_dump(data, sort_keys=False))

    replayed, tools, _ = await replay(keel, config, original, script)
    assert replayed.status == RunStatus.error and "ToolReplayMiss" in (replayed.error or ""), replayed.error
    assert counter.read_text() == "lead\nchild\n"
    (miss,) = tools.misses
    assert f"agent {child.split('@')[1]}" in miss and "echo elsewhere" in miss


async def test_a_result_over_the_cap_runs_live_and_is_checked_by_digest(
        keel: Keel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = tmp_path / "counter.txt"
    config = counting_config(keel, counter)
    monkeypatch.setattr(journal_callbacks, "RESULT_TEXT_MAX_CHARS", 0)  # no child result text is kept
    original, script = await record(keel, config, tmp_path)

    replayed, tools, differences = await replay(keel, config, original, script)
    assert replayed.status == RunStatus.success, replayed.error
    assert counter.read_text() == "lead\nchild\nchild\n"  # the child's call ran again, the lead's did not
    (write, child) = tools.live  # both matched and digest-checked (a differing one would be a miss)
    assert "write_file" in write[0] and "bash" in child[0] and "over the journal's text cap" in child[1]
    assert len(tools.answered) == 1 and differences == []


async def test_a_call_out_of_its_recorded_order_is_a_miss(keel: Keel, tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    config = counting_config(keel, counter)
    original, script = await record(keel, config, tmp_path)
    data = yaml.safe_load(script.read_text())
    lead = data["agents"]["lead"]
    lead[0], lead[1] = lead[1], lead[0]  # the note before the count: same calls, same ids, other order
    lead[0].pop("expect", None)
    lead[1].pop("expect", None)
    script.write_text(yaml.safe_dump(data, sort_keys=False))

    replayed, tools, _ = await replay(keel, config, original, script)
    assert replayed.status == RunStatus.error and "out of order" in (replayed.error or ""), replayed.error
    (miss,) = tools.misses
    assert "write_file" in miss and "recorded call #1 bash" in miss
    assert counter.read_text() == "lead\nchild\n"


async def test_a_tool_that_raised_is_answered_with_its_recorded_exception(
        keel: Keel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = tmp_path / "counter.txt"
    config = counting_config(keel, counter)
    real = shell.run_command

    async def vanishing(*args: Any, **kwargs: Any) -> Any:  # the command ran, then its sandbox failed
        await real(*args, **kwargs)
        raise OSError("the sandbox vanished   mid-command")

    with monkeypatch.context() as patched:
        patched.setattr(shell, "run_command", vanishing)
        original, script = await record(keel, config, tmp_path)
    async with keel.open(config) as rt:
        raised = [e for e in await journal(rt, original.run_id) if e.kind == "tool.call" and e.data["name"] == "bash"]
    assert [(e.data["error_type"], e.data["error_message"]) for e in raised] == [
        ("OSError", "the sandbox vanished mid-command")] * 2  # the lead's and the child's
    assert counter.read_text() == "lead\nchild\n"

    replayed, tools, differences = await replay(keel, config, original, script)
    assert replayed.status == RunStatus.success, replayed.error
    assert counter.read_text() == "lead\nchild\n"  # raised again by a stand-in: neither command ran
    assert differences == []  # the same error results, interventions and tool.call records
    assert [label.split(" (")[0].split(" ", 1)[1] for label in tools.answered] == ["#1 bash", "#1 bash"]
    async with keel.open(config) as rt:
        messages = await thread_messages(rt, replayed.thread_id)
    assert "failed with OSError: the sandbox vanished mid-command" in next(m.text for m in messages if m.type == "tool")


async def test_a_file_an_answered_call_wrote_is_named_not_reproducible(keel: Keel, tmp_path: Path) -> None:
    script: dict[str, Any] = {"lead": [turn("Making.", call("bash", command="echo made > outputs/made.txt")),
                                       turn("Made.")]}
    config = keel.config({"rec": script}, tools={"bash": True, "bash_unsandboxed": True})
    original, path = await record(keel, config, tmp_path)
    async with keel.open(offline_config(config, path)) as rt:
        report = await replay_and_compare(rt, original)
        made = workspace(config, report.replayed.thread_id) / "outputs" / "made.txt"
    assert report.replayed.status == RunStatus.success, report.replayed.error
    assert not made.exists()  # the bash call was answered, not executed
    (line,) = report.not_reproducible
    assert line.startswith("/workspace/outputs/made.txt: changed by bash call") and "not reproducible" in line
    assert report.differences == []  # left out of the comparison, not a divergence
