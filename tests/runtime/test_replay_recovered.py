"""A run recovered after its worker was killed (``kill -9``) is exported and re-run as it finished
(``runtime/finished_run.py``): what the lost attempt did that the next attempt did again is not
asked for twice, and a call the recovery did not repeat is answered as the recovery answered it.

The recording is made by a real ``keel run`` process, killed with SIGKILL in the middle of its run
and recovered by this process (``on_worker_lost: resume``: same host, dead pid, recovered at once):

* killed during a ``bash`` command (unsandboxed: it appends to a counter file, so whether it ran
  again is a fact): the resumed attempt answers the call with "outcome unknown"; the re-run must
  answer it the same way — neither executed nor a miss;
* killed during the model-retry backoff after a rate limit: the resumed attempt asks the model
  again, so the journal holds the lost attempt's failed call and the new attempt's; the export must
  hold one failure and the answer, as the finished run made them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from runtime_support import Keel, _param, backend_matrix, call, journal, thread_messages, turn, wait_until

from agentkeel.config import load_config
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.replay import offline_config, replay_and_compare
from agentkeel.runtime.script_export import export_script
from agentkeel.runtime.timeline import load_timeline

pytestmark = backend_matrix([_param("sqlite", "memory")])  # one database the killed process and this one share


def project(keel: Keel, lead: list[dict[str, Any]], retry_delay_ms: int, name: str) -> Path:
    raw = {
        "data_dir": str(keel.tmp_path / "data"), "database": keel.backend.database_url, "stream": "memory",
        "models": [{"name": "crash", "use": "scripted", "script": keel.script(lead)}],
        "assistants": [{"assistant_id": "lead", "model": "crash", "on_worker_lost": "resume"}],
        "tools": {"bash": True, "bash_unsandboxed": True},
        "limits": {"lease_ttl_s": 3, "llm_retry": {"base_delay_ms": retry_delay_ms, "max_delay_ms": retry_delay_ms}},
    }
    path = keel.tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def journal_kinds(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [kind for (kind,) in conn.execute("SELECT kind FROM journal ORDER BY seq")]


async def killed_run(keel: Keel, lead: list[dict[str, Any]], killed_after: str) -> tuple[RunRecord, Path]:
    """A ``keel run`` killed with SIGKILL once its journal holds ``killed_after``, recovered here;
    the finished run and the config it was recovered with (model retries without delay)."""
    slow = project(keel, lead, 30_000, "recording.yaml")
    db = Path(keel.backend.database_url.removeprefix("sqlite:///"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTKEEL_")}
    child = subprocess.Popen([sys.executable, "-m", "agentkeel.cli", "run", "go", "--config", str(slow)],
                             cwd=keel.tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_until(lambda: db.exists() and killed_after in _safe_kinds(db), timeout=60, interval=0.1,
                         what=f"the run to journal {killed_after}")
        await asyncio.sleep(0.3)  # whatever the journal buffers next would be lost anyway
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    config = load_config(project(keel, lead, 0, "recovering.yaml"))
    async with keel.open(config) as rt:  # executes "all": recovers the dead owner's run at once
        async def lost_run() -> RunRecord | None:
            (record,) = await rt.store.list_runs(limit=2)
            return record if record.status.terminal else None

        record = await wait_until(lost_run, timeout=30, interval=0.1, what="the killed run to be recovered")
    assert record.status == RunStatus.success and record.attempt == 2, record.error
    return record, config


def _safe_kinds(db: Path) -> list[str]:
    try:
        return journal_kinds(db)
    except sqlite3.Error:  # not migrated yet
        return []


async def exported(keel: Keel, config: Any, record: RunRecord) -> dict[str, Any]:
    async with keel.open(config, executes="none") as rt:
        timeline = await load_timeline(rt, record.run_id)
    assert timeline is not None
    return export_script(timeline.events, timeline.messages)


async def test_a_call_the_recovery_did_not_repeat_is_answered_as_it_was(keel: Keel) -> None:
    counter = keel.tmp_path / "counter.txt"
    lead = [turn("Counting.", call("bash", command=f"echo once >> {counter}; sleep 30")), turn("Checked.")]
    record, config = await killed_run(keel, lead, "tool.intent")
    assert counter.read_text() == "once\n"
    path = keel.tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump(await exported(keel, config, record), sort_keys=False))

    for live_tools in (False, True):  # answered from the recording, or executed: the call is not either way
        async with keel.open(offline_config(config, path)) as rt:
            report = await replay_and_compare(rt, record, live_tools=live_tools)
            messages = await thread_messages(rt, report.replayed.thread_id)
        assert report.replayed.status == RunStatus.success, report.replayed.error
        assert report.differences == [], report.differences
        assert counter.read_text() == "once\n"  # the lost call never ran again
        (result,) = [m for m in messages if m.type == "tool"]
        assert result.status == "error" and "outcome of this bash call is unknown" in result.text
        assert any("recovered run (2 attempts)" in r for r in report.remarks)
        if report.tools is not None:
            assert report.tools.answered == [] and report.tools.misses == []


async def test_a_model_call_the_next_attempt_made_again_is_exported_once(keel: Keel) -> None:
    lead = [turn(**{"raise": {"kind": "rate_limit", "message": "slow down"}}), turn("Answered after the retry.")]
    record, config = await killed_run(keel, lead, "model.error")
    async with keel.open(config, executes="none") as rt:
        events = await journal(rt, record.run_id)
    assert [(e.attempt, e.kind) for e in events if e.kind.startswith("model.")] == [
        (1, "model.error"), (2, "model.error"), (2, "model.call")]  # the lost failure, then the new attempt's two

    script = await exported(keel, config, record)
    assert [sorted(entry) for entry in script["agents"]["lead"]] == [["raise"], ["finish_reason", "say", "usage"]]
    path = keel.tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump(script, sort_keys=False))
    async with keel.open(offline_config(config, path)) as rt:
        report = await replay_and_compare(rt, record)
    assert report.replayed.status == RunStatus.success, report.replayed.error
    assert report.differences == [], report.differences
