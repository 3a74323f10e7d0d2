"""``keel run`` with provider models, as a user runs it: a real process calling the stubs through
``langchain-openai`` / ``langchain-anthropic``, its ledger (``--json``) and exit status checked
against what the provider received."""

from __future__ import annotations

import sqlite3
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


@dataclass
class Refused:
    """One ``keel run`` that must fail: its config, process and ledger."""

    config: Path
    result: subprocess.CompletedProcess[str]
    ledger: dict[str, Any]

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory, openai_stub_process: StubServer,
            anthropic_stub_process: StubServer) -> tuple[dict[str, Refused], list[dict[str, Any]]]:
    """A 401 (model ``gpt``), a missing key (``nokey``) and an unknown provider (``bogus``): three
    processes side by side, each on its own database; what the OpenAI stub received meanwhile."""
    stub = openai_stub_process
    stub.reset()
    stub.script({"error": "auth", "repeat": True})
    configs = {model: write_config(tmp_path_factory.mktemp(f"cli-{model}"), stub, anthropic_stub_process)
               for model in ("gpt", "nokey", "bogus")}
    with ThreadPoolExecutor(len(configs)) as pool:
        runs = pool.map(lambda model: keel_run(configs[model], "Write the note.", model), configs)
        done = {model: Refused(configs[model], *run) for model, run in zip(configs, runs, strict=True)}
    received = stub.requests()
    stub.reset()
    return done, received


def test_keel_run_401_is_sent_once_and_the_ledger_names_the_model_and_the_key_variable(
        refused: tuple[dict[str, Refused], list[dict[str, Any]]]) -> None:
    runs, received = refused
    run = runs["gpt"]
    assert run.result.returncode != 0
    assert len(received) == 1 and received[0]["answered"]["status"] == 401
    ledger = run.ledger
    assert ledger["status"] == "error" and ledger["clean"] is False
    assert "'gpt'" in ledger["error"] and STUB_KEY_ENV in ledger["error"]
    detail = ledger["error_detail"]
    assert (detail["kind"], detail["status"], detail["model"], detail["key_env"]) == ("auth", 401, "gpt", STUB_KEY_ENV)
    assert "finished cleanly" not in run.output


@pytest.mark.parametrize(("model", "named"), [("nokey", UNSET_KEY_ENV), ("bogus", "nosuchprovider")])
def test_keel_run_refuses_an_unusable_model_before_admission(
        refused: tuple[dict[str, Refused], list[dict[str, Any]]], model: str, named: str) -> None:
    run = refused[0][model]
    assert run.result.returncode != 0 and run.ledger == {}
    assert model in run.output and named in run.output and "Traceback" not in run.output, run.output
    assert run_records(run.config) == []  # refused before admission: no run record left behind
