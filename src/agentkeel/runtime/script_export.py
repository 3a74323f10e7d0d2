"""A recorded run as a scripted-model file (``docs/scripted-model.md``) that plays it again offline.

Why from the journal and not the checkpoints: the thread's checkpoints hold the lead's messages
only; a subagent runs inside its parent's tool step without checkpoints of its own, and compaction
summaries live in a channel of their own. Every ``model.call`` record carries what the model
answered (``output``: text, tool calls with their ids, provider shape) and which child made it
(``task_id``), and every ``model.error`` what kind of failure it was — in the order the calls were
made, which is the order the scripted model answers them in.

Which list an answer goes to is how the scripted model numbers instances (``for_agent`` claims
one per subagent when the child is built, and one ``summarization`` instance per chain with a
summarizer): the lead is ``lead``; child *k* of type ``T`` (in the order its ``task`` call was about
to run: its ``tool.intent``) is ``T#k``; summary calls go to ``summarization#k``, the lead's
summarizer first when ``limits.summarization`` is on, then each child's in creation order (a
child's chain always has one). Tool-call ids are written out, so the replay's task ids, tool
results and stop-reason sources are the recording's.

The script is strict, and ``fallback: error``: a replay that asks for one model call more than
was recorded fails with ``ScriptExhaustedError`` naming the agent, instance and turn, instead of
inventing an answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentkeel.config import KeelConfig
from agentkeel.harness.scripted.script import FALLBACK_ERROR, parse_script
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


class ExportError(ValueError):
    """The run cannot be written as a script (its journal predates recorded model outputs)."""


def export_script(events: Iterable[JournalEvent], config: KeelConfig) -> dict[str, Any]:
    """The script data (validated) that answers the run's model calls as they were answered."""
    ordered = sorted(events, key=lambda e: e.seq)
    instances = _instances(ordered, config)
    agents: dict[str, list[dict[str, Any]]] = {}
    for event in ordered:
        if event.kind not in ("model.call", "model.error"):
            continue
        key = _agent_key(event, instances)
        entry = _turn(event) if event.kind == "model.call" else _failure(event)
        agents.setdefault(key, []).append(entry)
    script = {"strict": True, "fallback": FALLBACK_ERROR, "agents": agents}
    parse_script(script, source="export")  # what we write must load
    return script


def _instances(events: list[JournalEvent], config: KeelConfig) -> dict[tuple[str, str | None], str]:
    """``(caller, task_id)`` -> the script key of that agent instance."""
    types: dict[str, str] = {}  # task id -> subagent type
    for event in events:
        if event.kind == "subagent.start" and event.data.get("task_id"):
            types[str(event.data["task_id"])] = str(event.data.get("subagent_type"))
    created: list[str] = []
    for event in events:  # a child is built (its model claimed) just after its intent is stored
        task = str(event.data.get("call_id") or event.data.get("task_id") or "")
        if event.kind in ("tool.intent", "subagent.start") and task in types and task not in created:
            created.append(task)
    keys: dict[tuple[str, str | None], str] = {(LEAD, None): LEAD}
    counts: dict[str, int] = {}
    summarizers = 0
    if config.limits.summarization.enabled:
        keys[(SUMMARY_CALLER, None)] = f"{SUMMARY_AGENT}#0"
        summarizers = 1
    for task in created:
        kind = types[task]
        keys[(f"subagent:{kind}", task)] = f"{kind}#{counts.get(kind, 0)}"
        counts[kind] = counts.get(kind, 0) + 1
        keys[(SUMMARY_CALLER, task)] = f"{SUMMARY_AGENT}#{summarizers}"  # a child always has one
        summarizers += 1
    return keys


def _agent_key(event: JournalEvent, instances: dict[tuple[str, str | None], str]) -> str:
    task = event.data.get("task_id")
    key = instances.get((event.caller or LEAD, str(task) if task else None))
    if key is None:
        raise ExportError(f"journal seq {event.seq}: a model call by {event.caller!r} (task {task!r}) "
                          "belongs to no agent instance of the run")
    return key


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
