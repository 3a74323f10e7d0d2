"""The children of a run: one item per subagent it started, read from its journal.

Why from the journal and not the run record: the executor journals ``subagent.start`` when a child
begins and ``subagent.end`` when it ends (see ``runtime/journal.py``), so a child that is still
running, or that a crash cut off, is visible too; the run record only knows the reasons the
children appended to its ``stop_reasons``. This is the one parser of those records: the ledger
(``keel runs show``) and the gateway's run resource both call it, so they cannot disagree.

A task started again (a recovered attempt re-running the same ``task_id``) shows its last start
and what followed it. A start with no end after it is ``running`` while the run is active and
``unfinished`` once the run has ended: the child stopped without reporting, and its usage, files
and stop reasons are unknown (null / empty), not zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.stores.base import JournalEvent, JournalStore

SUBAGENT_START = "subagent.start"
SUBAGENT_END = "subagent.end"
CHILD_KINDS = (SUBAGENT_START, SUBAGENT_END)

RUNNING = "running"
UNFINISHED = "unfinished"


def children_of(events: Iterable[JournalEvent], *, run_ended: bool) -> list[dict[str, Any]]:
    """One item per ``task_id`` from a run's journal events (other kinds are ignored), ordered
    by the seq of the child's start; see the module docstring for a start without an end."""
    starts: dict[str, JournalEvent] = {}
    ends: dict[str, JournalEvent] = {}
    for event in events:
        if event.kind in CHILD_KINDS:
            task_id = str(event.data.get("task_id") or f"seq-{event.seq}")
            (starts if event.kind == SUBAGENT_START else ends)[task_id] = event  # the last one stands
    items = []
    for task_id in starts.keys() | ends.keys():
        start, end = starts.get(task_id), ends.get(task_id)
        if start is not None and end is not None and end.seq < start.seq:
            end = None  # started again after it ended: the new attempt has not ended yet
        anchor = start if start is not None else ends[task_id]
        items.append(_item(task_id, anchor, start, end, run_ended))
    return sorted(items, key=lambda item: item["seq"])


async def run_children(journal: JournalStore, record: RunRecord) -> list[dict[str, Any]]:
    """The children of ``record``'s run, with one journal query (only the two subagent kinds)."""
    events = await journal.list(record.run_id, kinds=list(CHILD_KINDS))
    return children_of(events, run_ended=record.status.terminal)


def _item(
    task_id: str, anchor: JournalEvent, start: JournalEvent | None, end: JournalEvent | None, run_ended: bool
) -> dict[str, Any]:
    """``anchor`` is the start (the end when no start was journaled): its seq orders the item."""
    begun = start.data if start is not None else {}
    done = end.data if end is not None else {}

    def field(name: str) -> Any:  # named by both records: the end's value, else the start's
        value = done.get(name)
        return begun.get(name) if value is None else value

    if end is None:
        status = UNFINISHED if run_ended else RUNNING
    else:
        status = str(done.get("status") or "unknown")
    return {
        "task_id": task_id,
        "subagent_type": field("subagent_type") or _type_of(anchor.caller),
        "description": field("description"),
        "status": status,
        "stop_reason": done.get("stop_reason"),
        "stop_reasons": list(done.get("stop_reasons") or []),
        "usage": done.get("usage"),
        "model": field("model"),
        "depth": begun.get("depth"),
        "files_changed": list(done.get("files_changed") or []),
        "turns": done.get("turns"),
        "duration_s": done.get("duration_s"),
        "seq": anchor.seq,
        "error": done.get("error"),
        "brief": done.get("brief"),
    }


def _type_of(caller: str | None) -> str | None:
    """``subagent:<type>`` -> ``<type>``: the type when a record's data does not name it."""
    if caller and caller.startswith("subagent:"):
        return caller.removeprefix("subagent:")
    return None
