"""The ledger as a user reads it. "Why did it stop?": "finished cleanly" only for a clean success;
a failed run says what failed, on which model, and which key variable to check. "Subagents": one
row per child, nothing without any. The files changed name their agent when the records do."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from agentkeel.cli.render import render_ledger
from agentkeel.runtime.children import children_of
from children_support import EXPECTED, START_ORDER, events

CLEAN = "finished cleanly"


def _ledger(status: str, *, stop_reasons: list[dict[str, Any]] | None = None, error: str | None = None,
            error_detail: dict[str, Any] | None = None) -> dict[str, Any]:
    reasons = stop_reasons or []
    return {
        "run_id": "r1", "thread_id": "t1", "assistant_id": "lead", "status": status, "attempt": 1,
        "stop_reason": reasons[0]["code"] if reasons else None, "stop_reasons": reasons,
        "error": error, "error_detail": error_detail,
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "by_caller": {}, "by_model": {}},
        "clean": status == "success" and not reasons, "duration_s": 1.0, "model_calls": 1, "model_errors": 0,
        "tool_calls": {}, "tool_errors": 0, "files_changed": [], "interventions": [], "guards": [],
        "journal_events": 3, "resume": {"thread_id": "t1", "checkpoint_id": None, "question": None},
    }


def _why(ledger: dict[str, Any]) -> str:
    out = io.StringIO()
    render_ledger(Console(file=out, width=200, color_system=None), ledger)
    text = out.getvalue()
    return text[text.index("Why did it stop?"):text.index("What did it spend?")]


def _reason(code: str, klass: str) -> dict[str, Any]:
    return {"code": code, "class": klass, "source": "worker", "seq": 7, "detail": f"{code} happened", "data": {}}


def test_a_clean_success_finished_cleanly() -> None:
    assert CLEAN in _why(_ledger("success"))


def test_a_capped_success_lists_its_reasons_and_is_not_clean() -> None:
    why = _why(_ledger("success", stop_reasons=[_reason("token_capped", "budget")]))
    assert CLEAN not in why and "token_capped (primary)" in why


def test_a_rejected_key_names_the_error_the_model_and_the_key_variable() -> None:
    detail = {"type": "AuthenticationError", "message": "Incorrect API key provided", "kind": "auth",
              "status": 401, "code": "invalid_api_key", "attempts": 1, "model": "gpt",
              "use": "openai:gpt-4.1-mini", "key_env": "OPENAI_API_KEY"}
    why = _why(_ledger("error", error="ModelCallFailed: model call refused …", error_detail=detail))
    assert CLEAN not in why
    assert "failed: AuthenticationError (auth, HTTP 401): Incorrect API key provided" in why
    assert "model gpt (openai:gpt-4.1-mini) after 1 attempt" in why
    assert "check the API key in the environment variable OPENAI_API_KEY" in why


def test_exhausted_retries_say_how_many_attempts() -> None:
    detail = {"type": "RateLimitError", "message": "Rate limit reached", "kind": "rate_limit", "status": 429,
              "code": None, "attempts": 3, "model": "gpt", "use": "openai:gpt-4.1-mini", "key_env": None}
    why = _why(_ledger("error", error="ModelCallFailed: …", error_detail=detail))
    assert "after 3 attempts" in why and "environment variable" not in why and CLEAN not in why


def test_an_error_without_detail_still_shows_its_message() -> None:
    why = _why(_ledger("error", error="RuntimeError: the sandbox broke"))
    assert "failed: RuntimeError: the sandbox broke" in why and CLEAN not in why


def test_a_timeout_and_an_interruption_are_not_clean() -> None:
    timed_out = _why(_ledger("timeout", stop_reasons=[_reason("timeout", "budget")],
                             error="run exceeded its wall-clock limit of 5 s"))
    assert CLEAN not in timed_out and "timeout (primary)" in timed_out
    bare = _why(_ledger("timeout", error="run exceeded its wall-clock limit of 5 s"))
    assert "timed out: run exceeded its wall-clock limit of 5 s" in bare
    assert CLEAN not in _why(_ledger("interrupted"))
    assert CLEAN not in _why(_ledger("interrupted", stop_reasons=[_reason("cancelled", "cancellation")]))


def _render(ledger: dict[str, Any]) -> str:
    out = io.StringIO()
    render_ledger(Console(file=out, width=200, color_system=None), ledger)
    return out.getvalue()


def _subagents_section(text: str) -> str:
    return text[text.index("Subagents"):text.index("Which step changed which file?")]


def test_each_child_is_a_row_of_the_subagents_table() -> None:
    ledger = _ledger("success")
    ledger["subagents"] = children_of(events("r1", "t1"), run_ended=True)
    section = _subagents_section(_render(ledger))
    assert "(4 started)" in section
    lines = section.splitlines()
    rows = {task: next(line for line in lines if f" {task} " in line) for task in START_ORDER}
    assert [lines.index(rows[task]) for task in START_ORDER] == sorted(lines.index(row) for row in rows.values())
    for task, expected in EXPECTED.items():
        row = rows[task]
        assert expected["subagent_type"] in row and expected["status"] in row
        if expected["stop_reason"]:
            assert expected["stop_reason"] in row
    assert "1,200 / 300" in rows["t-capped"] and "src/parser.py" in rows["t-capped"]
    assert "800 / 150" in rows["t-done"]
    assert "unfinished" in rows["t-open"] and " - " in rows["t-open"]  # its usage is unknown, not zero
    assert "t-cancel: cancelled by the parent run" in section


def test_no_children_no_subagents_section() -> None:
    text = _render(_ledger("success"))
    assert "Subagents" not in text
    assert "Subagents" not in _render({**_ledger("success"), "subagents": []})


def test_files_changed_name_their_agent_when_the_records_do() -> None:
    change = {"path": "/workspace/src/parser.py", "change": "modified", "before_sha256": "a" * 64,
              "after_sha256": "b" * 64, "tool_call_id": "call_1", "tool_name": "str_replace", "tool_seq": 4}
    without = _render({**_ledger("success"), "files_changed": [change]})
    assert "agent" not in without.split("Which step changed which file?")[1]
    steps = [{"agent": "lead"}, {"agent": "subagent:coder/t-capped"}]
    named = _render({**_ledger("success"), "files_changed": [{**change, "agent": "subagent:coder/t-capped",
                                                               "steps": steps}]})
    files = named.split("Which step changed which file?")[1]
    assert "agent" in files and "lead, subagent:coder/t-capped" in files
