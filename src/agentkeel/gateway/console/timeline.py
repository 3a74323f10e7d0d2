"""The run page's document: one run's aligned timeline, as the console draws it.

One source of truth: the timeline is ``runtime/timeline.py``'s (``load_timeline``), the one
``keel replay`` draws and ``GET .../timeline`` serves — journal records, the run's checkpoints
and its retained stream events on one coordinate, subagents nested, attempts, and the divergence
checks of ``runtime/divergence.py``. This module adds only what a page needs on top of it: the
waterfall's rows placed in time (``waterfall.py``), the model calls as chart points, the file
diffs replayed from the checkpointed tool calls (``diffs.py``), the thread's head checkpoint (where
the thread continues, which a later run may have moved on) and the run resource.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime
from typing import Any

from langchain_core.messages import BaseMessage

from agentkeel.gateway.console.diffs import file_diffs, sha256_text
from agentkeel.gateway.console.waterfall import is_compaction, waterfall
from agentkeel.gateway.errors import NotFound
from agentkeel.runtime.checkpoints import checkpoint_config
from agentkeel.runtime.children import children_of
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.timeline import Item, attempts_of, load_timeline
from agentkeel.sandbox.workspace import Workspace

MAX_FINAL_BYTES = 256 * 1024  # the most of a file's final text read back from the workspace for a diff
CACHED_RUNS = 64  # runs whose checkpoint items are kept between reloads (a few hundred small items each)

# Reading a run's checkpoints deserializes each one whole (in full checkpoint mode every one holds
# all the messages so far), which grows with the square of the run's length; a live page reloads
# every 0.4 s. Checkpoints are immutable, so the items already read are reused and only newer
# checkpoints are read (``checkpoint_items(known=...)``). Keyed by the checkpointer too: one
# process may serve several runtimes (the tests do).
_checkpoints: OrderedDict[tuple[int, str], list[Item]] = OrderedDict()


async def run_timeline(runtime: Runtime, record: RunRecord, run: dict[str, Any]) -> dict[str, Any]:
    """The run page's document for ``record`` (``run`` is its Run resource, subagents included)."""
    key = (id(runtime.checkpointer), record.run_id)
    aligned = await load_timeline(runtime, record.run_id, _checkpoints.pop(key, []))
    if aligned is None:  # deleted (rolled back) between the access check and this read
        raise NotFound(f"Run {record.run_id} not found")
    _checkpoints[key] = aligned.checkpoints
    while len(_checkpoints) > CACHED_RUNS:
        _checkpoints.popitem(last=False)
    events = aligned.events
    origin = record.started_at or (events[0].ts if events and events[0].ts else record.created_at)
    changes = [{**e.data, "seq": e.seq} for e in events if e.kind == "file.changed"]
    workspace = _workspace(runtime, record.thread_id)
    return {
        "run": run,
        "started_at": origin.isoformat(),
        "ended_at": record.ended_at.isoformat() if record.ended_at else None,
        "last_seq": events[-1].seq if events else 0,
        "steps": waterfall(aligned, origin),
        "model_calls": [_model_point(e, origin) for e in events if e.kind == "model.call"],
        "changes": file_diffs(changes, _tool_calls(aligned.messages), lambda path, sha: _final_text(workspace, path, sha)),
        "manifest": next((e.data for e in events if e.kind == "chain.manifest"), None),
        "subagents": children_of(events, run_ended=record.status.terminal),
        "attempts": attempts_of(events),
        "checkpoints": len(aligned.checkpoints),
        "stream": {"state": aligned.stream_state, "events": len(aligned.stream), "gaps": aligned.stream_gaps},
        "divergences": [d.to_dict() for d in aligned.divergences],
        # Was a success clean or capped, and where does the thread continue.
        "clean": record.status is RunStatus.success and not record.stop_reasons,
        "resume_checkpoint_id": await _head_checkpoint(runtime, record.thread_id),
    }


async def _head_checkpoint(runtime: Runtime, thread_id: str) -> str | None:
    head = await runtime.checkpointer.aget_tuple(checkpoint_config(thread_id))
    return head.config["configurable"].get("checkpoint_id") if head else None


def _model_point(event: JournalEvent, origin: datetime) -> dict[str, Any]:
    """One model call for the spend and context charts."""
    data = event.data
    return {
        "seq": event.seq, "t_ms": None if event.ts is None else round((event.ts - origin).total_seconds() * 1000, 1),
        "caller": event.caller or "lead", "model": data.get("model"), "input_tokens": int(data.get("input_tokens") or 0),
        "output_tokens": int(data.get("output_tokens") or 0), "estimated": bool(data.get("estimated")),
        "compaction": is_compaction(event.caller),
    }


def _tool_calls(messages: list[BaseMessage]) -> dict[str, dict[str, Any]]:
    """Tool call id -> {name, args} of every call in the messages at the run's last checkpoint."""
    calls: dict[str, dict[str, Any]] = {}
    for message in messages:
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

