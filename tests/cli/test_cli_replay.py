"""``keel replay`` as a user meets it: a real process on the demo's SQLite database."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_cli import keel, keel_side_by_side


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One ``keel demo`` for the module (the demo and its process start-up are most of each test's
    time): its directory and run id. Tests never touch it; each works on a copy (``demo_run``)."""
    workdir = tmp_path_factory.mktemp("demo")
    demo = keel("demo", cwd=workdir)
    assert demo.returncode == 0, demo.stderr
    listed = keel("runs", "list", "--json", cwd=workdir)
    return workdir, str(json.loads(listed.stdout)[0]["run_id"])


@pytest.fixture
def demo_run(demo_dir: tuple[Path, str], tmp_path: Path) -> str:
    """The demo's run, in a copy of its directory at ``tmp_path`` (its database, threads and
    workspaces: relative to the directory, so the copy is a demo of its own to corrupt or fork)."""
    workdir, run_id = demo_dir
    shutil.copytree(workdir, tmp_path, symlinks=True, dirs_exist_ok=True)
    return run_id


def test_replay_shows_the_aligned_timeline_exports_and_reruns_offline(tmp_path: Path, demo_run: str) -> None:
    run_id = demo_run
    shown, shown_json = keel_side_by_side(("replay", run_id), ("replay", run_id, "--json"), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for text in ("attempt 1 started", "checkpoint step 0", "model lead demo", "tool write_file",
                 "✎ /workspace/outputs/report.md", "guard ReadBeforeWrite: blocked", "run ended success",
                 "journal, checkpoints and stream agree"):
        assert text in shown.stdout, text

    as_json = json.loads(shown_json.stdout)
    kinds = [i["kind"] for i in as_json["items"]]
    assert as_json["divergences"] == [] and as_json["stream"]["state"] == "gone"  # another process's memory stream
    assert kinds[0] == "run.start" and kinds[-1] == "run.end" and "checkpoint" in kinds
    seqs = [i["journal_seq"] for i in as_json["items"]]
    assert seqs == sorted(seqs)

    export = tmp_path / "export.yaml"
    rerun = keel("replay", run_id, "--export", str(export), "--rerun", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "same journal" in rerun.stdout and "same final state" in rerun.stdout
    # the demo's tools are all file tools: they run in the re-run's workspace, matched and checked
    assert "tools: 0 call(s) answered from the recording" in rerun.stdout
    assert "× its effects stay in the workspace" in rerun.stdout
    script = yaml.safe_load(export.read_text())
    lead_calls = [i for i in as_json["items"] if i["kind"] == "model.call" and i["caller"] == "lead"]
    assert script["fallback"] == "error" and len(script["agents"]["lead"]) == len(lead_calls)

    # the export is an ordinary script: `keel run` on it reproduces the run's answer offline
    config = tmp_path / "replay.yaml"
    config.write_text(yaml.safe_dump({"models": [{"name": "demo", "use": "scripted", "script": str(export)}]}))
    again = keel("run", "anything", "--config", str(config), "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["usage"]["total_tokens"] == json.loads(
        keel("runs", "show", run_id, "--json", cwd=tmp_path).stdout)["usage"]["total_tokens"]


def test_a_bad_run_id_is_a_message_and_a_non_zero_exit(tmp_path: Path) -> None:
    missing, both = keel_side_by_side(
        ("replay", "no-such-run"), ("replay", "x", "--fork-at", "3", "--model", "demo", "--script", "s.yaml"),
        cwd=tmp_path)
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr
    assert both.returncode == 2 and "not both" in both.stderr


def test_a_corrupted_journal_is_flagged_with_exit_1(tmp_path: Path, demo_run: str) -> None:
    run_id = demo_run
    with sqlite3.connect(tmp_path / ".agentkeel" / "keel.db") as db:
        db.execute("DELETE FROM journal WHERE run_id = ? AND seq = 5", (run_id,))
    shown = keel("replay", run_id, cwd=tmp_path)
    assert shown.returncode == 1
    assert "journal_gap" in shown.stdout and "journal seqs missing: 5" in shown.stdout


def test_a_fork_continues_the_thread_from_a_step_with_a_script(tmp_path: Path, demo_run: str) -> None:
    run_id = demo_run
    script = tmp_path / "fork.yaml"
    script.write_text(yaml.safe_dump({"agents": {"lead": [{"say": "A different ending."}]}}))
    forked = keel("replay", run_id, "--fork-at", "2", "--script", str(script), cwd=tmp_path)
    assert forked.returncode == 0, forked.stdout + forked.stderr
    assert "fork " in forked.stdout and "from step 2 — success" in forked.stdout
    runs = json.loads(keel("runs", "list", "--json", cwd=tmp_path).stdout)
    assert len(runs) == 2 and runs[0]["thread_id"] == runs[1]["thread_id"]


def test_a_later_run_of_a_thread_reruns_from_where_it_started(tmp_path: Path) -> None:
    def script(name: str, path: str) -> str:
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"agents": {"lead": [
            {"say": "Writing.", "tool_calls": [{"name": "write_file", "args": {"path": path, "content": f"{name}\n"}}]},
            {"say": f"Wrote {path}."}]}}))
        return f"{name}.yaml"

    config = tmp_path / "keel.yaml"
    config.write_text(yaml.safe_dump({"models": [
        {"name": "one", "use": "scripted", "script": script("one", "/workspace/outputs/one.md")},
        {"name": "two", "use": "scripted", "script": script("two", "/workspace/outputs/two.md")}]}))
    for model in ("one", "two"):
        ran = keel("run", f"write {model}", "--config", str(config), "--thread", "t-later", "--model", model,
                   cwd=tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    second = json.loads(keel("runs", "list", "--json", "--config", str(config), cwd=tmp_path).stdout)[0]["run_id"]
    rerun = keel("replay", second, "--rerun", "--config", str(config), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr  # refused with exit 2 before
    assert "not its thread's first" in rerun.stdout and "same journal" in rerun.stdout
