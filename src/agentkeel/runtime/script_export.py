"""A recorded run as a scripted-model file (``docs/scripted-model.md``) that plays it again offline.

Why from the journal and not the checkpoints: the thread's checkpoints hold the lead's messages
only; a subagent runs inside its parent's tool step without checkpoints of its own, and compaction
summaries live in a channel of their own. Every ``model.call`` record carries what the model
answered (``output``: text, tool calls with their ids, provider shape) and which child made it
(``task_id``), and every ``model.error`` what kind of failure it was — in the order the calls were
made, which is the order the scripted model answers them in.

Which list an answer goes to: the lead's calls to ``lead``; a subagent's to ``<type>@<task id>``
and its compaction summaries to ``summarization@<task id>`` (the scripted model picks a task's list
by the task id in the call's metadata, so which of two parallel children is built first does not
matter); the lead's summaries to ``summarization``. Tool-call ids are written out, so the replay's
task ids, tool results and stop-reason sources are the recording's.

The script is strict, and ``fallback: error``: a replay that asks for one model call more than
was recorded fails with ``ScriptExhaustedError`` naming the agent, instance and turn, instead of
inventing an answer.

A recovered run (several attempts) is exported as it finished (``runtime/finished_run.py``): the
model calls its lost attempt made in the step it died in, which the next attempt made again, are
left out; those the next attempt continued from (up to its last checkpoint) are kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

from agentkeel.harness.scripted.script import FALLBACK_ERROR, parse_script
from agentkeel.runtime.finished_run import as_finished
from agentkeel.runtime.stores.base import JournalEvent

SUMMARY_CALLER = "middleware:summarization"
SUMMARY_AGENT = "summarization"
LEAD = "lead"

# A provider's own finish reason -> the script's (see the table in docs/scripted-model.md).
_FINISH = {
    "stop": "stop", "end_turn": "stop", "STOP": "stop", "tool_calls": "tool_calls", "tool_use": "tool_calls",
    "length": "length", "max_tokens": "length", "MAX_TOKENS": "length", "content_filter": "content_filter",
    "refusal": "refusal", "SAFETY": "SAFETY",
}
_PROVIDER = {"openai": "openai", "anthropic": "anthropic", "google_genai": "gemini"}
_ERROR_KINDS = ("rate_limit", "server_error", "bad_request", "timeout")
_PLACEHOLDER = re.compile(r"\{(turn|agent|instance)\}")


class ExportError(ValueError):
    """The run cannot be written as a script (its journal predates recorded model outputs)."""


def export_script(events: Iterable[JournalEvent], messages: Sequence[BaseMessage] = ()) -> dict[str, Any]:
    """The script data (validated) that answers the run's model calls as they were answered.

    ``messages`` (the thread's checkpointed messages) make a lead tool result that comes out
    different a loud miss at once: each lead turn after a tool call expects the start of that
    call's recorded result in its request (``expect: {contains}``), so the replay fails there with
    ``ScriptExpectationError`` instead of answering a conversation that has already diverged.
    """
    ordered = as_finished(events)  # a recovered run: each model call the finished run made, once
    results = {m.tool_call_id: str(m.text) for m in messages if isinstance(m, ToolMessage)}
    agents: dict[str, list[dict[str, Any]]] = {}
    previous: JournalEvent | None = None  # the lead's previous model call
    for event in ordered:
        if event.kind not in ("model.call", "model.error"):
            continue
        key = _agent_key(event)
        entry = _turn(event) if event.kind == "model.call" else _failure(event)
        if key == LEAD:
            expected = _expected(previous, results)
            if expected:
                entry["expect"] = {"contains": expected}
            previous = event
        agents.setdefault(key, []).append(entry)
    script = {"strict": True, "fallback": FALLBACK_ERROR, "agents": agents}
    parse_script(script, source="export")  # what we write must load
    return script


def _agent_key(event: JournalEvent) -> str:
    """The list that answers this call: ``lead``, ``<type>@<task>`` for a subagent's, and
    ``summarization@<task>`` / ``summarization`` for a child's / the lead's compaction summary."""
    task = event.data.get("task_id")
    caller = event.caller or LEAD
    if caller == LEAD and not task:
        return LEAD
    if caller == SUMMARY_CALLER:
        return f"{SUMMARY_AGENT}@{task}" if task else SUMMARY_AGENT
    if caller.startswith("subagent:") and task:
        return f"{caller.removeprefix('subagent:')}@{task}"
    raise ExportError(f"journal seq {event.seq}: a model call by {caller!r} (task {task!r}) belongs to no "
                      "agent of the run")


def _turn(event: JournalEvent) -> dict[str, Any]:
    output = event.data.get("output")
    if not isinstance(output, dict) or "text" not in output:
        raise ExportError(f"journal seq {event.seq}: the model call has no recorded output (a journal "
                          "written before model outputs were journaled cannot be exported)")
    entry: dict[str, Any] = {}
    if output.get("text"):
        entry["say"] = output["text"]
    calls = [{"name": c["name"], "id": c["id"], "args": c.get("args") or {}} for c in output.get("tool_calls") or []]
    calls += [{"name": c.get("name") or "unknown", "id": c["id"], "raw_args": c.get("raw_args") or ""}
              for c in output.get("invalid_tool_calls") or []]
    if calls:
        entry["tool_calls"] = calls
    entry["usage"] = {"input": int(event.data.get("input_tokens") or 0), "output": int(event.data.get("output_tokens") or 0)}
    finish = _FINISH.get(str(event.data.get("finish_reason")))
    if finish is not None:
        entry["finish_reason"] = finish
    provider = _PROVIDER.get(str(output.get("provider")))
    if provider is not None and provider != "openai":
        entry["provider"] = provider
    return entry


def _expected(previous: JournalEvent | None, results: dict[str, str]) -> str | None:
    """The first line (at most 60 characters) of the result of the lead's previous tool call, or
    None when there is none to expect (or it holds a template placeholder the script would fill)."""
    calls = ((previous.data.get("output") or {}).get("tool_calls") or []) if previous is not None else []
    text = results.get(str(calls[0].get("id"))) if calls else None
    first = (text or "").strip().splitlines()[0][:60].strip() if (text or "").strip() else ""
    return first if first and not _PLACEHOLDER.search(first) else None


def _failure(event: JournalEvent) -> dict[str, Any]:
    kind = event.data.get("kind")
    status = event.data.get("status")
    if kind not in _ERROR_KINDS:
        code = status if isinstance(status, int) else 500
        kind = {429: "rate_limit", 408: "timeout"}.get(code, "bad_request" if 400 <= code < 500 else "server_error")
    failure: dict[str, Any] = {"kind": kind}
    if event.data.get("message"):
        failure["message"] = str(event.data["message"])[:2000]
    return {"raise": failure}


__all__ = ["ExportError", "export_script"]
