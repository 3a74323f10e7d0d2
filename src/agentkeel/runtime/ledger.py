"""The run ledger: the answers to a user's plain questions about one run, as data.

Why did it stop (status, primary stop reason, every reason), what did it spend (tokens by caller and
by model, model and tool calls), which step changed which file (tool call id and journal seq, with
before/after hashes), and where can it resume (thread and head checkpoint).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.stores.base import JournalStore


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
        tup = await checkpointer.aget_tuple({"configurable": {"thread_id": record.thread_id, "checkpoint_ns": ""}})
        head = tup.config["configurable"].get("checkpoint_id") if tup else None
    return {
        "run_id": record.run_id,
        "thread_id": record.thread_id,
        "assistant_id": record.assistant_id,
        "status": record.status.value,
        "attempt": record.attempt,
        "clean": not record.stop_reasons and record.status.value == "success",
        "stop_reason": record.stop_reason,
        "stop_reasons": record.stop_reasons,
        "error": record.error,
        "duration_s": duration,
        "usage": record.usage,
        "model_calls": len(model_calls),
        "model_errors": sum(1 for e in events if e.kind == "model.error"),
        "tool_calls": dict(Counter(e.data.get("name", "?") for e in tool_calls)),
        "tool_errors": sum(1 for e in tool_calls if e.data.get("status") == "error"),
        "files_changed": [e.data | {"seq": e.seq} for e in events if e.kind == "file.changed"],
        "journal_events": len(events),
        "resume": {"thread_id": record.thread_id, "checkpoint_id": head},
    }
