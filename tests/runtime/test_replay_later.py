"""A re-run of a thread's later run starts where that run started (``runtime/replay_thread.py``):
from the checkpoint before it and the workspace's files as they were then, and is compared with
that run's own journal, state and files — not with the thread as the runs after it left it.

The thread has three runs: the first writes ``a.md``, the second reads it and writes ``b.md``, the
third adds ``c.md`` and rewrites ``b.md``. Re-running the second must see the first's history and
``a.md`` (its ``read_file`` result is checked against the recording) and none of the third's work.
A fourth run then rewrites ``a.md``: its content before the second run is gone (the journal keeps
hashes of changed files), which the re-run names as not reproducible.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from runtime_support import (
    UNGATED,
    Keel,
    _param,
    backend_matrix,
    call,
    journal,
    new_thread_id,
    run_to_end,
    thread_messages,
    turn,
)

from agentkeel.config import KeelConfig
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.replay import offline_config, replay_and_compare
from agentkeel.runtime.replay_thread import run_bounds
from agentkeel.runtime.script_export import export_script
from agentkeel.runtime.timeline import load_timeline

pytestmark = backend_matrix([_param("sqlite", "memory"), _param("postgres", "redis")])

A, B, C = "/workspace/outputs/a.md", "/workspace/outputs/b.md", "/workspace/outputs/c.md"


def three_runs(keel: Keel) -> KeelConfig:
    return keel.config({
        "first": [turn("Writing a.", call("write_file", path=A, content="alpha\n")), turn("Wrote a.")],
        "second": [turn("Reading a.", call("read_file", path=A)),
                   turn("Writing b.", call("write_file", path=B, content="beta\n")), turn("Read a, wrote b.")],
        "third": [turn("Adding c.", call("write_file", path=C, content="gamma\n")),
                  turn("Rewriting b.", call("write_file", path=B, content="beta two\n")), turn("Done.")],
        "fourth": [turn("Rewriting a.", call("write_file", path=A, content="alpha two\n")), turn("Done.")],
    }, limits=UNGATED)


async def export_of(keel: Keel, config: KeelConfig, record: RunRecord, tmp_path: Path) -> Path:
    async with keel.open(config) as rt:
        timeline = await load_timeline(rt, record.run_id)
    assert timeline is not None
    path = tmp_path / f"export-{record.run_id[:8]}.yaml"
    path.write_text(yaml.safe_dump(export_script(timeline.events, timeline.messages), sort_keys=False))
    return path


async def test_a_later_run_reruns_from_its_own_start_and_compares_with_its_own_end(
        keel: Keel, tmp_path: Path) -> None:
    config = three_runs(keel)
    thread = new_thread_id("later")
    async with keel.open(config) as rt:
        runs = [await run_to_end(rt, thread, f"run {name}", model_name=name) for name in ("first", "second", "third")]
        second = runs[1]
        recorded_messages = len(await thread_messages(rt, thread))
        bounds = await run_bounds(rt, second)
        recorded_tool_calls = [e for e in await journal(rt, second.run_id) if e.kind == "tool.call"]
    assert [r.status for r in runs] == [RunStatus.success] * 3
    assert not bounds.first_of_thread and bounds.start is not None
    assert set(bounds.files_before) == {"outputs/a.md"}  # b.md came with the second, c.md with the third
    assert set(bounds.files_after) == {"outputs/a.md", "outputs/b.md"}

    script = await export_of(keel, config, second, tmp_path)
    async with keel.open(offline_config(config, script)) as rt:
        report = await replay_and_compare(rt, second)
        replayed_messages = await thread_messages(rt, report.replayed.thread_id)
        replayed_tools = [e for e in await journal(rt, report.replayed.run_id) if e.kind == "tool.call"]
    assert report.replayed.status == RunStatus.success, report.replayed.error
    assert report.differences == [] and report.not_reproducible == []
    assert report.tools is not None and report.tools.misses == []
    # the first run's history is there, the third's is not: the messages as the second run left them
    assert len(replayed_messages) < recorded_messages
    assert [m.type for m in replayed_messages[:4]] == ["human", "ai", "tool", "ai"]
    assert "alpha" in replayed_messages[6].text  # its read_file of a.md, read in the re-run's workspace
    assert [e.data["result_sha256"] for e in replayed_tools] == [e.data["result_sha256"] for e in recorded_tool_calls]
    assert any("not its thread's first" in r for r in report.remarks)


async def test_a_file_whose_earlier_content_is_gone_is_named_not_reproducible(keel: Keel, tmp_path: Path) -> None:
    config = three_runs(keel)
    thread = new_thread_id("gone")
    async with keel.open(config) as rt:
        runs = [await run_to_end(rt, thread, f"run {name}", model_name=name)
                for name in ("first", "second", "third", "fourth")]
    second = runs[1]
    script = await export_of(keel, config, second, tmp_path)
    async with keel.open(offline_config(config, script)) as rt:
        report = await replay_and_compare(rt, second)
    (gone,) = report.not_reproducible
    assert gone.startswith(A) and "not kept" in gone
    # the second run read a.md: without it, its read differs — a real divergence, reported as one
    assert report.replayed.status == RunStatus.error and "ToolReplayMiss" in (report.replayed.error or "")
