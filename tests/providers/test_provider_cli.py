"""``keel run`` with provider models, as a user runs it: a real process calling the stubs through
``langchain-openai`` / ``langchain-anthropic``, its ledger (``--json``) and exit status checked
against what the provider received."""

from __future__ import annotations

import sqlite3
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from keel_support import UNSET_KEY_ENV, keel_run, tool_task, workspace, write_config
from provider_support import STUB_KEY_ENV, StubServer


@pytest.fixture
def config(tmp_path: Path, openai_stub: StubServer, anthropic_stub: StubServer) -> Path:
    return write_config(tmp_path, openai_stub, anthropic_stub)


def run_records(config: Path) -> list[str]:
    database = config.parent / "keel.db"
    if not database.exists():
        return []
    with sqlite3.connect(database) as conn:
        return [row[0] for row in conn.execute("SELECT run_id FROM runs")]


def both(config: Path, *models: str) -> list[tuple[subprocess.CompletedProcess[str], dict[str, Any]]]:
    """``keel run`` once per model, the processes side by side: each costs seconds of imports, and
    runs on different stubs (or none) cannot see each other's scripts."""
    with ThreadPoolExecutor(len(models)) as pool:
        return list(pool.map(lambda model: keel_run(config, "Write the note.", model), models))


def test_keel_run_completes_a_tool_task_with_the_providers_exact_usage(
        config: Path, openai_stub: StubServer, anthropic_stub: StubServer) -> None:
    stubs = {"gpt": openai_stub, "claude": anthropic_stub}
    expected = {model: tool_task(stub) for model, stub in stubs.items()}
    for model, (result, ledger) in zip(stubs, both(config, *stubs), strict=True):
        stub = stubs[model]
        assert result.returncode == 0, result.stderr
        assert ledger["status"] == "success" and ledger["clean"] is True
        usage = ledger["usage"]
        assert (usage["input_tokens"], usage["output_tokens"]) == (expected[model]["input"], expected[model]["output"])
        assert ledger["model_calls"] == 2 and stub.served_usage() == expected[model] and stub.violations() == []
        [change] = ledger["files_changed"]
        assert change["path"] == "/workspace/outputs/note.md" and change["tool_name"] == "write_file"
        note = workspace(config, ledger["thread_id"]) / "outputs" / "note.md"
        assert note.read_text() == "hello from a provider\n"


def test_keel_run_401_is_sent_once_and_the_ledger_names_the_model_and_the_key_variable(
        config: Path, openai_stub: StubServer, anthropic_stub: StubServer) -> None:
    stubs = {"gpt": openai_stub, "claude": anthropic_stub}
    for stub in stubs.values():
        stub.script({"error": "auth", "repeat": True})
    for model, (result, ledger) in zip(stubs, both(config, *stubs), strict=True):
        assert result.returncode != 0
        assert len(stubs[model].requests()) == 1
        assert ledger["status"] == "error" and ledger["clean"] is False
        assert f"'{model}'" in ledger["error"] and STUB_KEY_ENV in ledger["error"]
        detail = ledger["error_detail"]
        assert (detail["kind"], detail["status"], detail["model"], detail["key_env"]) == ("auth", 401, model, STUB_KEY_ENV)
        assert "finished cleanly" not in result.stdout + result.stderr


def test_keel_run_refuses_an_unusable_model_before_admission(config: Path, openai_stub: StubServer) -> None:
    (missing, missing_ledger), (unknown, unknown_ledger) = both(config, "nokey", "bogus")
    for result, ledger, named in ((missing, missing_ledger, UNSET_KEY_ENV), (unknown, unknown_ledger, "nosuchprovider")):
        assert result.returncode != 0 and ledger == {}
        output = result.stdout + result.stderr
        assert named in output and "Traceback" not in output, output
    assert "nokey" in missing.stdout + missing.stderr and "bogus" in unknown.stdout + unknown.stderr
    assert run_records(config) == []  # refused before admission: no run record left behind
    assert openai_stub.requests() == []
