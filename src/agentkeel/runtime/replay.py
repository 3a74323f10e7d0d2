"""Deterministic re-execution of a recorded run, and forks from any aligned point of it.

**Re-run** (:func:`rerun`): the run again, on a new thread, with every model of the config swapped
for the scripted model playing the run's export (``runtime/script_export.py``) — the same
assistant, input, limits and tools, no provider reachable. Model outputs come from the recording
(a call beyond it fails loudly: the script ends in ``fallback: error``), and so do tool results
when the re-run is given :func:`recorded_tools` (``runtime/tool_replay.py``: a tool is not
executed, a call the recording does not hold fails the run); without them, tools run for real in
the new thread's workspace. Either way :func:`compare` holds the results to the recording's (each
``tool.call`` journals its result's ``result_sha256``) along with everything else the journal and
the final state say. Equal means: the same journal record for record (kinds, callers, data,
timings and owners aside) and the same final state (messages, durable channels, workspace files).

**Fork** (:func:`fork`): a new run on the recorded thread from the run's checkpoint at a
superstep, with a live model of the config or a scripted one — LangGraph's time travel: what
the checkpoint already holds is kept, and everything after it executes again.

What a re-run cannot reproduce is refused up front rather than diverging silently: a run that was
not its thread's first (the new thread would lack the earlier history).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agentkeel.config import KeelConfig
from agentkeel.harness.durable import durable_values
from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.requests import request_from_record
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.timeline import checkpoint_items
from agentkeel.runtime.tool_replay import RecordedTools
from agentkeel.sandbox.workspace import Workspace

# Journal data that differs between two executions of the same run by nature, not by behaviour.
VOLATILE = frozenset({"latency_ms", "duration_ms", "duration_s", "queued_s", "owner", "lease_expired_at",
                      "seq", "tool_seq", "subagent_seq", "created_at", "updated_at", "started_at", "ended_at", "at"})


class ReplayError(ValueError):
    """The run cannot be re-run or forked as asked (the message says why)."""


def offline_config(config: KeelConfig, script: Path) -> KeelConfig:
    """``config`` with every model (names kept, so journals compare) played by ``script``."""
    models = [m.model_copy(update={"use": "scripted", "script": str(script.resolve()), "api_key_env": None,
                                   "base_url": None, "options": {}}) for m in config.models]
    return config.model_copy(update={"models": models})


async def first_of_thread(runtime: Any, record: RunRecord) -> bool:
    """Whether the run started its thread (its first checkpoint has no parent)."""
    items = await checkpoint_items(runtime.checkpointer, record)
    if not items:
        return True
    first = await runtime.checkpointer.aget_tuple(
        {"configurable": {"thread_id": record.thread_id, "checkpoint_ns": "", "checkpoint_id": items[0].ident}})
    return first is None or first.parent_config is None


async def rerun(runtime: Any, record: RunRecord, thread_id: str | None = None,
                tools: RecordedTools | None = None) -> RunRecord:
    """Execute ``record``'s request again on a new thread of ``runtime`` (whose config is the
    :func:`offline_config`); the replay's final record. With ``tools`` (built from the recording,
    ``runtime/tool_replay.py``) the recording answers the tool calls; without, they run."""
    request = dataclasses.replace(
        request_from_record(record), thread_id=thread_id or f"replay-{uuid.uuid4().hex[:12]}", checkpoint=None,
        metadata={**record.metadata, "replay_of": record.run_id},
    )
    if tools is None:
        return await _run(runtime, request)
    runtime.manager.tool_replays[request.thread_id] = tools
    try:
        return await _run(runtime, request)
    finally:
        runtime.manager.tool_replays.pop(request.thread_id, None)


async def recorded_tools(runtime: Any, record: RunRecord) -> RecordedTools:
    """What answers a re-run's tool calls: the run's journal and its thread's final messages."""
    accessor = await runtime.accessor(record.assistant_id)
    snapshot = await accessor.aget(record.thread_id)
    messages = list((snapshot.values if snapshot is not None else {}).get("messages") or [])
    return RecordedTools.from_recording(await runtime.journal.list(record.run_id), messages)


async def fork(runtime: Any, record: RunRecord, step: int, *, model_name: str | None = None,
               input: Any = None) -> RunRecord:
    """A new run on ``record``'s thread from its root checkpoint at superstep ``step``."""
    roots = [c for c in await checkpoint_items(runtime.checkpointer, record) if not c.data["namespace"]]
    target = next((c for c in roots if c.step == step), None)
    if target is None:
        raise ReplayError(f"run {record.run_id} has no checkpoint at step {step} "
                          f"(its steps: {[c.step for c in roots]})")
    request = dataclasses.replace(
        request_from_record(record), input=input, command=None,
        checkpoint={"checkpoint_id": str(target.ident)},
        model_name=model_name or request_from_record(record).model_name,
        metadata={**record.metadata, "forked_from": {"run_id": record.run_id, "step": step}},
    )
    return await _run(runtime, request)


async def _run(runtime: Any, request: Any) -> RunRecord:
    created = await runtime.manager.create(request)
    final = await runtime.manager.wait(created.run_id)
    if final is None:
        raise ReplayError(f"run {created.run_id} was deleted before it could be read")
    return final


# -- comparing two executions -----------------------------------------------------------------


def journal_signature(events: list[JournalEvent], *records: RunRecord) -> dict[str, list[Any]]:
    """The journal as comparable data: per agent (``run``, or a child's task id) its records in
    order — kind, caller, step and data, without what differs by nature (timings, owners, seqs)
    and with the ids of ``records`` (the run; for a replay, the recorded run too, whose tool-call
    ids it plays) replaced by placeholders.

    Why per agent: children running in parallel interleave in the journal as the scheduler
    happens to run them; each child's own records are sequential, and so is the run's at the
    grain of its supersteps (within one, e.g. the results of parallel task calls, the order is
    the children's finishing order, so records of one step are compared as a set).
    """
    names = _placeholders(*records)
    groups: dict[str, list[tuple[int | None, str]]] = {}
    for e in sorted(events, key=lambda e: e.seq):
        data = _strip(e.data)
        entry = _normal({"kind": e.kind, "caller": e.caller, "attempt": e.attempt, "step": e.step, "data": data},
                        names)
        group = str(e.data.get("task_id") or "run") if e.kind != "stop_reason" else "run"
        groups.setdefault(_normal(group, names), []).append((e.step, json.dumps(entry, sort_keys=True, default=str)))
    out: dict[str, list[Any]] = {}
    for group, entries in groups.items():
        if group == "run":
            entries = sorted(entries, key=lambda x: (x[0] if x[0] is not None else -1, x[1]))
        out[group] = [json.loads(text) for _, text in entries]
    return out


async def final_state(runtime: Any, record: RunRecord, *also: RunRecord) -> dict[str, Any]:
    """The thread's messages and durable channels, and the workspace's files (path -> sha256);
    ids as in :func:`journal_signature`."""
    accessor = await runtime.accessor(record.assistant_id)
    snapshot = await accessor.aget(record.thread_id)
    values = snapshot.values if snapshot is not None else {}
    root = Workspace.for_thread(runtime.config.data_path, record.thread_id).real_root
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.rglob("*")) if p.is_file()}
    messages = list(values.get("messages") or [])
    state = {"messages": [_message(m) for m in messages], "durable": durable_values(values), "files": files}
    # Message ids are random for user and tool messages: a durable record names them by position.
    names = {str(m.id): f"<message {i}>" for i, m in enumerate(messages) if m.id} | _placeholders(record, *also)
    return dict(_normal(_strip(json.loads(json.dumps(state, default=str))), names))


def compare(expected: Any, actual: Any, path: str = "", limit: int = 20) -> list[str]:
    """Where ``actual`` differs from ``expected`` (at most ``limit`` places, each with its path)."""
    out: list[str] = []
    _diff(expected, actual, path or "$", out, limit)
    return out


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(dict.fromkeys([*a, *b])):
            _diff(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}", out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            _diff(a[index] if index < len(a) else "<missing>", b[index] if index < len(b) else "<missing>",
                  f"{path}[{index}]", out, limit)
    elif a != b:
        out.append(f"{path}: recorded {_short(a)}, replayed {_short(b)}")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:119] + "…"


def _message(message: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"type": message.type, "text": message.text}
    if isinstance(message, AIMessage):
        out["tool_calls"] = [{"id": c.get("id"), "name": c["name"], "args": c["args"]} for c in message.tool_calls]
    if isinstance(message, ToolMessage):
        out |= {"tool_call_id": message.tool_call_id, "name": message.name, "status": message.status}
    return out


def _placeholders(*records: RunRecord) -> dict[str, str]:
    names: dict[str, str] = {}
    for record in records:  # the full ids first: the scripted model's ids use the run id's first 8
        names |= {record.run_id: "<run>", record.thread_id: "<thread>"}
    for record in records:
        names[record.run_id[:8]] = "<run>"
    return names


def _strip(value: Any) -> Any:
    """``value`` without :data:`VOLATILE` keys, at any depth."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _normal(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, placeholder in names.items():
            value = value.replace(name, placeholder)
        return value
    if isinstance(value, list):
        return [_normal(v, names) for v in value]
    if isinstance(value, dict):
        return {_normal(k, names): _normal(v, names) for k, v in value.items()}
    return value


__all__ = ["ReplayError", "compare", "final_state", "first_of_thread", "fork", "journal_signature",
           "offline_config", "recorded_tools", "rerun"]
