"""The console's one access to a run's timeline: what the run page draws, as one JSON document.

This module is an adapter on purpose. It builds the timeline from what the runtime records today
— the run record, the journal (model and tool calls with their latency and duration, subagent
starts and ends, interventions, stop reasons, recoveries, file changes, the chain manifest) and the
thread's checkpointed messages (the tool-call arguments the file diffs replay, see ``diffs``) and
head checkpoint. The
aligned timeline of ``runtime/timeline.py`` (one coordinate over checkpoints, journal and stream) is
to replace the body of :func:`run_timeline`; the document's shape is what the page relies on.

Placement in time: every journal record carries the moment it was recorded. A model call's record
is written when the call returned, so it spans ``ts - latency_ms`` to ``ts``; a tool call likewise
with ``duration_ms``; a subagent spans its start and end records; everything else is a point. Times
are milliseconds from the run's start (its ``started_at``, else its first record).

Nesting: a subagent's records carry the caller ``subagent:<type>``; each is placed under the
innermost child of that type that was open (started, not yet ended) at its seq, and each child
under the lead's ``task`` tool call with the child's ``task_id`` as call id, when there is one.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from agentkeel.gateway.console.diffs import file_diffs, sha256_text
from agentkeel.runtime.checkpoints import checkpoint_config
from agentkeel.runtime.children import SUBAGENT_END, SUBAGENT_START, children_of
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.sandbox.workspace import Workspace

log = logging.getLogger(__name__)

MAX_FINAL_BYTES = 256 * 1024  # the most of a file's final text read back from the workspace for a diff
POINT_KINDS = {"intervention", "stop_reason", "run.recovered", "error", "journal.dropped", "run.status"}


async def run_timeline(runtime: Runtime, record: RunRecord, run: dict[str, Any]) -> dict[str, Any]:
    """The run page's document for ``record`` (``run`` is its Run resource, subagents included)."""
    events = await runtime.journal.list(record.run_id)
    origin = record.started_at or (events[0].ts if events and events[0].ts else record.created_at)
    steps = _steps(events, origin)
    changes = [{**e.data, "seq": e.seq} for e in events if e.kind == "file.changed"]
    workspace = _workspace(runtime, record.thread_id)
    return {
        "run": run,
        "started_at": origin.isoformat(),
        "ended_at": record.ended_at.isoformat() if record.ended_at else None,
        "last_seq": events[-1].seq if events else 0,
        "steps": steps,
        "model_calls": [_model_point(e, origin) for e in events if e.kind == "model.call"],
        "changes": file_diffs(changes, await _tool_calls(runtime, record), lambda path, sha: _final_text(workspace, path, sha)),
        "manifest": next((e.data for e in events if e.kind == "chain.manifest"), None),
        "subagents": children_of(events, run_ended=record.status.terminal),
        # Was a success clean or capped, and where does the thread continue (its head checkpoint,
        # which a later run on the thread may have moved on).
        "clean": record.status is RunStatus.success and not record.stop_reasons,
        "resume_checkpoint_id": await _head_checkpoint(runtime, record.thread_id),
    }


async def _head_checkpoint(runtime: Runtime, thread_id: str) -> str | None:
    head = await runtime.checkpointer.aget_tuple(checkpoint_config(thread_id))
    return head.config["configurable"].get("checkpoint_id") if head else None


def _ms(moment: datetime | None, origin: datetime) -> float | None:
    return None if moment is None else round((moment - origin).total_seconds() * 1000, 1)


def _model_point(event: JournalEvent, origin: datetime) -> dict[str, Any]:
    """One model call for the spend and context charts."""
    data = event.data
    return {
        "seq": event.seq, "t_ms": _ms(event.ts, origin), "caller": event.caller or "lead",
        "model": data.get("model"), "input_tokens": int(data.get("input_tokens") or 0),
        "output_tokens": int(data.get("output_tokens") or 0), "estimated": bool(data.get("estimated")),
        "compaction": (event.caller or "").startswith("middleware:summarization"),
    }


def _steps(events: list[JournalEvent], origin: datetime) -> list[dict[str, Any]]:
    """The waterfall's rows in seq order, each with ``parent`` (the row id it nests under)."""
    steps: list[dict[str, Any]] = []
    open_children: list[tuple[str, str, dict[str, Any]]] = []  # (type, task_id, row), oldest first
    task_rows: dict[str, dict[str, Any]] = {}  # the lead's task call id -> its row
    for event in events:
        row = _row(event, origin)
        if row is None:
            continue
        caller = event.caller or "lead"
        if event.kind == SUBAGENT_END:
            _close_child(open_children, event, origin)
            continue
        if event.kind == SUBAGENT_START:
            task_id = str(event.data.get("task_id") or f"seq-{event.seq}")
            row["parent"] = task_rows[task_id]["id"] if task_id in task_rows else None
            open_children.append((caller.removeprefix("subagent:"), task_id, row))
        elif caller.startswith("subagent:"):
            owner = _innermost(open_children, caller.removeprefix("subagent:"))
            row["parent"] = owner["id"] if owner else None
        if event.kind == "tool.call" and event.data.get("name") == "task" and event.data.get("call_id"):
            task_rows[str(event.data["call_id"])] = row
        steps.append(row)
    _adopt_children(steps, task_rows)
    return steps


def _adopt_children(steps: list[dict[str, Any]], task_rows: dict[str, dict[str, Any]]) -> None:
    """A ``task`` call's record is written when it returns, after its child started: nest the
    child under it now that both are known."""
    for row in steps:
        if row["kind"] == "subagent" and row.get("parent") is None and row["task_id"] in task_rows:
            row["parent"] = task_rows[row["task_id"]]["id"]


def _innermost(open_children: list[tuple[str, str, dict[str, Any]]], subagent_type: str) -> dict[str, Any] | None:
    for kind, _task, row in reversed(open_children):
        if kind == subagent_type:
            return row
    return None


def _close_child(open_children: list[tuple[str, str, dict[str, Any]]], event: JournalEvent, origin: datetime) -> None:
    task_id = str(event.data.get("task_id") or "")
    for index, (_kind, open_task, row) in enumerate(open_children):
        if open_task == task_id:
            row["end_ms"] = _ms(event.ts, origin)
            row["status"] = str(event.data.get("status") or "unknown")
            row["detail"] = {**row["detail"], "stop_reason": event.data.get("stop_reason"), "usage": event.data.get("usage"),
                             "turns": event.data.get("turns"), "error": event.data.get("error")}
            del open_children[index]
            return


def _row(event: JournalEvent, origin: datetime) -> dict[str, Any] | None:
    """A waterfall row for the record, or None for kinds the waterfall does not draw."""
    data, end = event.data, _ms(event.ts, origin)
    base = {"id": f"s{event.seq}", "seq": event.seq, "caller": event.caller or "lead", "parent": None, "end_ms": end}
    if event.kind == "model.call":
        took = float(data.get("latency_ms") or 0)
        what = "compaction summary" if (event.caller or "").startswith("middleware:summarization") else "model"
        label = f"{what} {data.get('model') or '?'}: {data.get('input_tokens') or 0} in / {data.get('output_tokens') or 0} out"
        return {**base, "kind": "model", "label": label, "start_ms": _before(end, took), "status": "ok",
                "detail": {k: data.get(k) for k in ("model", "input_tokens", "output_tokens", "latency_ms", "finish_reason", "estimated")}}
    if event.kind == "model.error":
        took = float(data.get("latency_ms") or 0)
        return {**base, "kind": "model", "label": f"model error: {data.get('error_type')}", "start_ms": _before(end, took),
                "status": "error", "detail": dict(data)}
    if event.kind == "tool.call":
        took = float(data.get("duration_ms") or 0)
        return {**base, "kind": "tool", "label": f"tool {data.get('name')}", "start_ms": _before(end, took),
                "status": str(data.get("status") or "ok"), "call_id": data.get("call_id"), "detail": dict(data)}
    if event.kind == SUBAGENT_START:
        return {**base, "kind": "subagent", "label": f"subagent {data.get('subagent_type')}: {data.get('description') or ''}".strip(),
                "start_ms": end, "end_ms": None, "status": "running", "task_id": str(data.get("task_id") or f"seq-{event.seq}"),
                "detail": {k: data.get(k) for k in ("task_id", "subagent_type", "description", "model", "depth")}}
    if event.kind == SUBAGENT_END:
        return base | {"kind": "subagent-end"}
    if event.kind == "file.changed":
        return {**base, "kind": "file", "label": f"{data.get('change')} {data.get('path')}", "start_ms": end,
                "status": "ok", "detail": {k: data.get(k) for k in ("path", "change", "tool_call_id", "tool_seq")}}
    if event.kind in POINT_KINDS:
        label = {"intervention": f"guard {data.get('middleware')}: {data.get('action')}",
                 "stop_reason": f"stop reason {data.get('code')}",
                 "run.recovered": f"recovered: attempt {data.get('attempt')} ({data.get('policy')})"}.get(event.kind, event.kind)
        return {**base, "kind": event.kind.replace(".", "-"), "label": label, "start_ms": end, "status": "ok", "detail": dict(data)}
    return None


def _before(end: float | None, took_ms: float) -> float | None:
    return None if end is None else round(max(end - took_ms, 0.0), 1)


async def _tool_calls(runtime: Runtime, record: RunRecord) -> dict[str, dict[str, Any]]:
    """Tool call id -> {name, args} of every call in the thread's checkpointed messages."""
    try:
        snapshot = await (await runtime.accessor(record.assistant_id)).aget(record.thread_id)
    except Exception as exc:  # an assistant no longer configured, a checkpoint that cannot be read
        log.info("timeline of %s: no tool-call arguments (%r)", record.run_id, exc)
        return {}
    values = snapshot.values if snapshot is not None else None
    messages = values.get("messages") if isinstance(values, dict) else None
    calls: dict[str, dict[str, Any]] = {}
    for message in messages or []:
        for call in getattr(message, "tool_calls", None) or []:
            if call.get("id"):
                calls[str(call["id"])] = {"name": call.get("name"), "args": call.get("args") or {}}
    return calls


def _workspace(runtime: Runtime, thread_id: str) -> Workspace | None:
    try:
        return Workspace.for_thread(runtime.config.data_path, thread_id)
    except ValueError:
        return None


def _final_text(workspace: Workspace | None, path: str, sha256: str) -> str | None:
    """The file's text now, if it still hashes to what the run left (``sha256``) and is small text."""
    if workspace is None or not workspace.root.is_dir():  # resolving would create it
        return None
    try:
        real = workspace.resolve(path)
        if real.is_symlink() or not real.is_file() or real.stat().st_size > MAX_FINAL_BYTES:
            return None
        text = real.read_bytes().decode("utf-8")
    except (OSError, ValueError):  # gone, unreadable, outside the workspace, not UTF-8
        return None
    return text if sha256_text(text) == sha256 else None

