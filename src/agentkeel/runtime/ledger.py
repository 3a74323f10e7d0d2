"""The run ledger: the answers to a user's plain questions about one run, as data.

Why did it stop (status, primary stop reason, every reason), what did the guards do short of
stopping it (every intervention: a blocked write, a retry, a repaired request), what did it spend
(tokens by caller and by model, model and tool calls), which step changed which file (tool call id
and journal seq, with before/after hashes), what did each subagent do (``subagents``, see
``runtime/children.py``), and where can it resume (thread and head checkpoint).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from agentkeel.runtime.checkpoints import checkpoint_config
from agentkeel.runtime.children import children_of
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.stores.base import JournalStore

_RECORD_FIELDS = (
    "run_id", "thread_id", "assistant_id", "status", "attempt",
    "stop_reason", "stop_reasons", "error", "error_detail", "usage",
)


async def build_ledger(
    record: RunRecord, journal: JournalStore, checkpointer: BaseCheckpointSaver | None = None
) -> dict[str, Any]:
    events = await journal.list(record.run_id)
    model_calls = [e for e in events if e.kind == "model.call"]
    tool_calls = [e for e in events if e.kind == "tool.call"]
    duration = (
        (record.ended_at - record.started_at).total_seconds()
        if record.ended_at and record.started_at else None
    )
    head = None
    if checkpointer is not None:
        tup = await checkpointer.aget_tuple(checkpoint_config(record.thread_id))
        head = tup.config["configurable"].get("checkpoint_id") if tup else None
    fields = record.to_dict()
    return {
        **{key: fields[key] for key in _RECORD_FIELDS},
        "clean": not record.stop_reasons and record.status == RunStatus.success,
        "duration_s": duration,
        "model_calls": len(model_calls),
        "model_errors": sum(1 for e in events if e.kind == "model.error"),
        "tool_calls": dict(Counter(e.data.get("name", "?") for e in tool_calls)),
        "tool_errors": sum(1 for e in tool_calls if e.data.get("status") == "error"),
        "files_changed": [e.data | {"seq": e.seq} for e in events if e.kind == "file.changed"],
        "interventions": [
            {"seq": e.seq, "middleware": e.data.get("middleware"), "action": e.data.get("action"),
             "detail": e.data.get("detail")}
            for e in events if e.kind == "intervention"
        ],
        "subagents": children_of(events, run_ended=record.status.terminal),
        "guards": next((e.data.get("order", []) for e in events if e.kind == "chain.manifest"), []),
        "journal_events": len(events),
        "resume": {"thread_id": record.thread_id, "checkpoint_id": head, "question": _question(record)},
    }


def _question(record: RunRecord) -> str | None:
    """The question the run paused on (``ask_clarification``), if it ended waiting for an answer."""
    for entry in reversed(record.stop_reasons):
        if entry.get("code") == "clarification_requested":
            return str((entry.get("data") or {}).get("question") or "") or None
    return None
