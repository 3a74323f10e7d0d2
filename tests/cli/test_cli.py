"""The `keel` command as a user meets it: a real process, real SQLite, exit codes and output."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

KEEL = [sys.executable, "-m", "agentkeel.cli"]


def keel(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTKEEL_")}
    full_env.update({"COLUMNS": "160", "NO_COLOR": "1", **(env or {})})
    return subprocess.run([*KEEL, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120)


def keel_side_by_side(*calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Independent ``keel`` commands started together, their results in order: each spends seconds
    starting up (mostly imports), and two cores start two at once (more at once only thrash)."""
    with ThreadPoolExecutor(min(len(calls), 2)) as pool:
        return list(pool.map(lambda args: keel(*args, cwd=cwd), calls))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def test_demo_runs_to_a_clean_ledger_and_runs_show_reads_it_back(workdir: Path) -> None:
    demo = keel("demo", cwd=workdir)
    assert demo.returncode == 0, demo.stderr
    for heading in ("Why did it stop?", "What did the guards do?", "What did it spend?",
                    "Which step changed which file?", "Where can it resume?"):
        assert heading in demo.stdout
    assert "success" in demo.stdout and "outputs/report.md" in demo.stdout
    assert (workdir / ".agentkeel" / "keel.db").is_file()

    listed = keel("runs", "list", "--json", cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert [r["status"] for r in runs] == ["success"]
    run_id = runs[0]["run_id"]
    shown = keel("runs", "show", run_id, "--json", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    ledger = json.loads(shown.stdout)
    assert ledger["run_id"] == run_id and ledger["status"] == "success" and ledger["clean"] is True
    assert ledger["usage"]["total_tokens"] > 0 and ledger["model_calls"] > 10
    report = next(c for c in ledger["files_changed"] if c["path"] == "/workspace/outputs/report.md")
    assert report["tool_call_id"] and report["tool_seq"] > 0 and report["after_sha256"]
    workspace = workdir / ".agentkeel" / "threads" / ledger["thread_id"] / "workspace"
    report_text = (workspace / "outputs" / "report.md").read_text()
    assert "Use **PostgreSQL**" in report_text and "sqlite" not in report_text  # every edit landed
    # The demo's one unread edit was refused by the gate, then retried after a re-read.
    assert [(i["middleware"], i["action"]) for i in ledger["interventions"]] == [("ReadBeforeWrite", "blocked")]
    assert "LoopDetection" in ledger["guards"] and "TokenBudget" in ledger["guards"]


def test_chain_prints_the_checked_manifest(workdir: Path) -> None:
    shown = keel("chain", "--agent", "lead", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    manifest = json.loads(shown.stdout)
    assert manifest["kind"] == "lead" and "Clarification" in manifest["order"]
    assert manifest["axes"]["model"]["outer_to_inner"][-1] == "RequestGrammar"
    sub = json.loads(keel("chain", "--kind", "subagent", cwd=workdir).stdout)
    assert sub["kind"] == "subagent" and "Clarification" not in sub["order"] and "LoopDetection" in sub["order"]
    missing = keel("chain", "--agent", "nobody", cwd=workdir)
    assert missing.returncode == 2 and "nobody" in missing.stderr and "Traceback" not in missing.stderr


def test_run_with_a_script_that_fails_exits_non_zero_with_the_error_in_the_ledger(workdir: Path) -> None:
    (workdir / "fail.yaml").write_text("agents:\n  lead:\n    - raise: {kind: server_error, message: boom}\n")
    (workdir / "keel.yaml").write_text(
        "models: [{name: failing, use: scripted, script: fail.yaml}]\nlimits: {llm_retry: {max_attempts: 1}}\n"
    )
    result = keel("run", "hello", "--config", "keel.yaml", "--json", cwd=workdir)
    assert result.returncode == 1
    ledger = json.loads(result.stdout)
    assert ledger["status"] == "error" and "boom" in ledger["error"]
    assert ledger["error_detail"]["kind"] == "server_error" and ledger["error_detail"]["model"] == "failing"
    shown = keel("runs", "show", ledger["run_id"], cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    assert "finished cleanly" not in shown.stdout
    assert "failed: ScriptedServerError (server_error, HTTP 500): boom" in shown.stdout
    assert "model failing (scripted) after 1 attempt" in shown.stdout


def test_bad_input_gets_a_clear_message_and_a_non_zero_exit(workdir: Path) -> None:
    (workdir / "bad.yaml").write_text("limits: {run_timeout_s: soon}\n")
    (workdir / "guard.yaml").write_text("limits: {loop_detection: {warn_threshold: 6}}\n")
    (workdir / "mw.yaml").write_text("assistants: [{assistant_id: lead, middleware: ['nope.module:Thing']}]\n")
    (workdir / "broken.yaml").write_text("agents: {lead: [{say: 'unclosed}]}\n")
    (workdir / "script_cfg.yaml").write_text("models: [{name: m, use: scripted, script: broken.yaml}]\n")
    bad_config, bad_guard, bad_middleware, bad_script, bad_model, missing = keel_side_by_side(
        ("run", "hi", "--config", "bad.yaml"),
        ("run", "hi", "--config", "guard.yaml"),
        ("run", "hi", "--config", "mw.yaml"),
        ("run", "hi", "--config", "script_cfg.yaml"),
        ("run", "hi", "--model", "nope"),
        ("runs", "show", "no-such-run"),
        cwd=workdir,
    )
    assert bad_config.returncode == 2 and "limits.run_timeout_s" in bad_config.stderr
    assert "Traceback" not in bad_config.stderr

    assert bad_guard.returncode == 2 and "limits.loop_detection" in bad_guard.stderr
    assert "hard_limit must be >= warn_threshold" in bad_guard.stderr and "Traceback" not in bad_guard.stderr

    assert bad_middleware.returncode == 2 and "assistants.0.middleware.0" in bad_middleware.stderr
    assert "Traceback" not in bad_middleware.stderr

    assert bad_script.returncode == 2 and "broken.yaml" in bad_script.stderr and "Traceback" not in bad_script.stderr

    assert bad_model.returncode == 2 and "allowlist" in bad_model.stderr and "Traceback" not in bad_model.stderr

    assert missing.returncode == 1 and "no run" in missing.stderr


def test_a_clarification_is_answered_with_resume(workdir: Path) -> None:
    (workdir / "ask.yaml").write_text(
        "agents:\n  lead:\n    - say: Which format?\n      tool_calls:\n"
        "        - {name: ask_clarification, args: {question: 'Markdown or HTML?'}}\n"
    )
    (workdir / "go.yaml").write_text(
        "agents:\n  lead:\n    - tool_calls: [{name: write_file, args: {path: out.md, content: ok}}]\n"
        "      expect: {contains: 'The user answered: Markdown'}\n    - say: Written.\n"
    )
    (workdir / "keel.yaml").write_text(
        "models:\n  - {name: ask, use: scripted, script: ask.yaml}\n  - {name: go, use: scripted, script: go.yaml}\n"
    )
    asked = keel("run", "write it", "--config", "keel.yaml", "--thread", "t-ask", cwd=workdir)
    assert asked.returncode == 0, asked.stderr
    assert "clarification_requested" in asked.stdout and "waiting for an answer to: Markdown or HTML?" in asked.stdout
    assert "--resume" in asked.stdout
    answered = keel("run", "--resume", "Markdown", "--thread", "t-ask", "--model", "go", "--config", "keel.yaml",
                    "--json", cwd=workdir)
    assert answered.returncode == 0, answered.stderr
    ledger = json.loads(answered.stdout)
    assert ledger["status"] == "success" and ledger["stop_reasons"] == [] and ledger["resume"]["question"] is None
    assert (workdir / ".agentkeel" / "threads" / "t-ask" / "workspace" / "out.md").read_text() == "ok"

    neither, no_thread = keel_side_by_side(
        ("run", "--config", "keel.yaml"), ("run", "--resume", "yes", "--config", "keel.yaml"), cwd=workdir)
    assert neither.returncode == 2 and "either a PROMPT or --resume" in neither.stderr
    assert no_thread.returncode == 2 and "--thread" in no_thread.stderr


def _assert_refused(host: str, code: int, stderr: str) -> None:
    text = " ".join(stderr.split())  # rich wraps at the terminal's width
    assert code == 2, host
    assert "no authentication" in text and "--insecure" in text
    assert "auth.mode" in text  # the other way out: configure authentication
    assert "Traceback" not in text


def test_serve_refuses_a_non_loopback_host_without_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One real process (the exit code a user's shell sees); the other hosts through the same
    # command in this process, which saves a start-up (seconds on 2 cores) per host.
    result = keel("serve", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
    _assert_refused("0.0.0.0", result.returncode, result.stderr)
    from typer.testing import CliRunner

    import agentkeel.cli.serve
    from agentkeel.cli.main import app

    def served(*args: object, **kwargs: object) -> int:
        raise AssertionError("the refused host was served")  # a regression fails, never hangs

    monkeypatch.setattr(agentkeel.cli.serve, "serve_gateway", served)
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("AGENTKEEL_")]:
        monkeypatch.delenv(name)
    for host in ("192.168.1.10", "::", "example.com"):
        invoked = CliRunner().invoke(app, ["serve", "--host", host, "--port", "0"])
        assert not isinstance(invoked.exception, Exception), invoked.exception  # only the exit
        _assert_refused(host, invoked.exit_code, invoked.stderr)
    assert not (tmp_path / ".agentkeel").exists()  # refused before anything was set up


def test_loopback_hosts_are_recognised() -> None:
    from agentkeel.cli.main import is_loopback_host

    assert all(is_loopback_host(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]", "LOCALHOST"))
    assert not any(is_loopback_host(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.evil"))


def test_worker_metrics_port_in_use_or_out_of_range_is_a_cli_error(workdir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        refused = keel("worker", "--metrics-port", str(port), cwd=workdir)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in refused.stderr and "ready" not in refused.stdout
    out_of_range = keel("worker", "--metrics-port", "70000", cwd=workdir)
    assert out_of_range.returncode == 2 and "--metrics-port" in out_of_range.stderr and "65535" in out_of_range.stderr
