"""One run's aligned timeline, as data: journal, checkpoints and stream on one axis.

Why one axis is possible: every journal record, every checkpoint the run wrote and every stream
event it published carries the same coordinate ``(run_id, attempt, step, journal_seq)`` (the
journal stamps its events, ``checkpoints/stamping.py`` the checkpoints, the publish path the
stream events). The journal is the spine — each item sits after the journal record its
``journal_seq`` names; a checkpoint and the stream events published at the same point follow it.

Why the stream is only an annotation: it is a live view with bounded retention, gone after its
TTL and, on the memory bridge, with its process. What it still holds is shown and checked against
the durable record, never trusted over it; what it no longer holds is reported, not guessed.

Subagents: a child's records are nested under its ``subagent.start`` (its ``task`` call): each
record a child makes names its ``task_id`` (model and tool calls through the callbacks, its guards'
records through the child's ``TaskJournal``), so parallel children never mix.

``runtime/divergence.py`` checks the timeline; ``cli/replay.py`` renders it; the console can
render the same ``Timeline.to_dict()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from agentkeel.runtime.bridge import StreamBridge
from agentkeel.runtime.bridge.base import EventKind
from agentkeel.runtime.checkpoints import checkpoint_config
from agentkeel.runtime.checkpoints.listing import CheckpointHead, checkpoint_heads
from agentkeel.runtime.checkpoints.stamping import COORDINATE_KEY
from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.stores.base import JournalEvent

JOURNAL, CHECKPOINT, STREAM = "journal", "checkpoint", "stream"
_RANK = {JOURNAL: 0, CHECKPOINT: 1, STREAM: 2}


@dataclass
class Item:
    """One point of the timeline: a journal record, a checkpoint or a stream event."""

    source: str  # journal | checkpoint | stream
    kind: str  # the journal kind, "checkpoint", or the stream event's name
    attempt: int | None
    step: int | None
    journal_seq: int  # a journal record's own seq; for the others the last seq before them
    caller: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    ident: str | int | None = None  # checkpoint id, stream seq; None for journal records
    children: list[Item] = field(default_factory=list)  # a task call's subagent records
    files: list[dict[str, Any]] = field(default_factory=list)  # a tool call's file changes

    @property
    def order(self) -> tuple[int, int, int]:
        own = self.ident if isinstance(self.ident, int) else 0
        return (self.journal_seq, _RANK[self.source], own)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source, "kind": self.kind, "attempt": self.attempt, "step": self.step,
            "journal_seq": self.journal_seq, "caller": self.caller, "data": self.data, "id": self.ident,
        }
        if self.children:
            out["children"] = [child.to_dict() for child in self.children]
        if self.files:
            out["files"] = self.files
        return out


@dataclass
class Divergence:
    """Something the three surfaces disagree on, or a hole in one of them."""

    code: str
    detail: str
    journal_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail, "journal_seq": self.journal_seq}


@dataclass
class Timeline:
    record: RunRecord
    events: list[JournalEvent]
    checkpoints: list[Item]
    stream: list[Item]
    stream_state: str  # "retained" (with END), "live" (no END yet), "gone"
    stream_gaps: list[dict[str, Any]]
    messages: list[BaseMessage]  # the thread's messages at the run's last checkpoint
    items: list[Item] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.record.to_dict(),
            "attempts": attempts_of(self.events),
            "stream": {"state": self.stream_state, "events": len(self.stream), "gaps": self.stream_gaps},
            "checkpoints": len(self.checkpoints),
            "items": [item.to_dict() for item in self.items],
            "divergences": [d.to_dict() for d in self.divergences],
        }


def journal_item(event: JournalEvent) -> Item:
    return Item(JOURNAL, event.kind, event.attempt, event.step, event.seq, event.caller, dict(event.data))


def align(events: list[JournalEvent], checkpoints: list[Item], stream: list[Item]) -> list[Item]:
    """The top-level items in timeline order, subagent records nested, file changes and intents
    folded into their tool calls."""
    items = [journal_item(e) for e in sorted(events, key=lambda e: e.seq)]
    tools = {str(i.data.get("call_id")): i for i in items if i.kind == "tool.call" and i.data.get("call_id")}
    shown: list[Item] = []
    for item in items:
        if item.kind == "tool.intent":
            continue  # the tool call that follows says more; the divergence checks read intents
        if item.kind == "file.changed":
            steps = item.data.get("steps") or [item.data]
            owners = [tools.get(str(step.get("tool_call_id"))) for step in steps]
            for index, (owner, step) in enumerate(zip(owners, steps, strict=True)):
                if owner is not None:  # the run's change on its first step, a modification after it
                    change = item.data.get("change") if index == 0 or index == len(steps) - 1 and \
                        item.data.get("change") == "deleted" else "modified"
                    owner.files.append({"path": item.data.get("path"), "change": change,
                                        "after_sha256": step.get("after_sha256")})
            if any(owners):
                continue  # shown under the tool call(s) that made it
        shown.append(item)
    return sorted(_nest(shown) + checkpoints + stream, key=lambda i: i.order)


def _nest(items: list[Item]) -> list[Item]:
    """Move each child's records under its ``subagent.start``; return what stays on top."""
    starts: dict[str, Item] = {}
    open_by_type: dict[str, list[str]] = {}
    last_active: list[str] = []  # task ids, most recently journaling last
    top: list[Item] = []
    for item in items:
        task = str(item.data.get("task_id") or "")
        if item.kind == "subagent.start" and task:
            starts[task] = item
            open_by_type.setdefault(str(item.caller), []).append(task)
            last_active.append(task)
            parent = str(item.data.get("parent_task_id") or "")  # a grandchild: under its delegating child
            (starts[parent].children if parent in starts else top).append(item)
            continue
        owner = _owner(item, task, starts, open_by_type, last_active)
        if item.kind == "subagent.end" and task in starts:
            starts[task].data["end"] = item.data
            with contextlib.suppress(ValueError):
                open_by_type.get(str(item.caller), []).remove(task)
            with contextlib.suppress(ValueError):
                last_active.remove(task)
            continue
        if owner is not None:
            last_active.remove(owner)
            last_active.append(owner)
            starts[owner].children.append(item)
        else:
            top.append(item)
    return top


def _owner(item: Item, task: str, starts: dict[str, Item], open_by_type: dict[str, list[str]],
           last_active: list[str]) -> str | None:
    """The open child this record belongs to, if any."""
    if task in starts and item.kind != "subagent.start" and task in last_active:
        return task
    running = open_by_type.get(item.caller or "", [])
    return running[0] if len(running) == 1 else None  # a record of the only child of its type


def attempts_of(events: Iterable[JournalEvent]) -> list[dict[str, Any]]:
    """Each attempt the journal knows: how it began (start, recovery) and how it ended."""
    attempts: dict[int, dict[str, Any]] = {}
    for event in events:
        attempt = event.attempt if event.attempt is not None else event.data.get("attempt")
        if not isinstance(attempt, int):
            continue
        entry = attempts.setdefault(attempt, {"attempt": attempt, "first_seq": event.seq, "began": None,
                                              "ended": None})
        if event.kind == "run.start":
            entry["began"] = "resumed" if event.data.get("resumed_from") else "started"
            entry["owner"] = event.data.get("owner")
        elif event.kind == "run.recovered":
            entry["began"] = f"recovered ({event.data.get('policy')})"
            entry["lost_owner"] = event.data.get("lost_owner")
        elif event.kind == "run.end":
            entry["ended"] = event.data.get("status")
        entry["last_seq"] = event.seq
    return [attempts[n] for n in sorted(attempts)]


# -- reading the three surfaces ---------------------------------------------------------------


async def checkpoint_items(checkpointer: Any, record: RunRecord, known: Sequence[Item] = ()) -> list[Item]:
    """The checkpoints of the run's thread that this run wrote, oldest first.

    ``known``: this run's items from an earlier call (a page reloading a live run). A checkpoint
    never changes once written and a thread's ids grow with time, so the listing (newest first, by
    metadata: ``checkpoints/listing.py``) stops at the first known id instead of reading the whole
    thread again; the known items are kept only while the newest of them is still stored.
    """
    known_ids = {str(i.ident) for i in known}
    if known_ids and await checkpointer.aget_tuple(checkpoint_config(record.thread_id, max(known_ids))) is None:
        known, known_ids = (), set()  # the thread was pruned or rolled back since: read it all
    items: list[Item] = list(known)
    async with contextlib.aclosing(checkpoint_heads(checkpointer, record.thread_id)) as heads:
        async for head in heads:
            if head.checkpoint_id in known_ids:
                break
            if (item := _checkpoint_item(head, record.run_id)) is not None:
                items.append(item)
    return sorted(items, key=lambda i: (i.step if i.step is not None else -10, i.journal_seq))


def _checkpoint_item(head: CheckpointHead, run_id: str) -> Item | None:
    """The timeline item of one checkpoint, if ``run_id`` wrote it."""
    metadata = head.metadata
    stamp = metadata.get(COORDINATE_KEY) or {}
    if (stamp.get("run_id") or metadata.get("run_id")) != run_id:
        return None
    return Item(
        CHECKPOINT, "checkpoint", stamp.get("attempt"), metadata.get("step"), int(stamp.get("journal_seq") or 0),
        data={"checkpoint_id": head.checkpoint_id, "source": metadata.get("source"),
              "namespace": head.checkpoint_ns, "stamped": bool(stamp)},
        ident=head.checkpoint_id,
    )


async def stream_items(bridge: StreamBridge, run_id: str) -> tuple[list[Item], str, list[dict[str, Any]]]:
    """What the run's stream still retains (never waiting for more): its items, its state
    (``retained`` up to END, ``live`` while still open, ``gone``) and the gaps it reported."""
    if not await bridge.exists(run_id):
        return [], "gone", []
    items: list[Item] = []
    gaps: list[dict[str, Any]] = []
    state = "live"
    subscription = bridge.subscribe(run_id, last_event_id="-1", heartbeat_s=0.05)
    async with contextlib.aclosing(subscription) as events:
        async for event in events:
            if event.kind == EventKind.data:
                at = event.coordinate or {}
                items.append(Item(STREAM, event.event, at.get("attempt"), at.get("step"),
                                  int(at.get("journal_seq") or 0), data={"stamped": bool(at)}, ident=event.seq))
            elif event.kind == EventKind.gap:
                gaps.append(dict(event.data))
            elif event.kind == EventKind.end:
                state = "retained"
                break
            else:  # a heartbeat (caught up with a live stream) or a cursor error
                break
    return items, state, gaps


async def load_timeline(runtime: Any, run_id: str, known_checkpoints: Sequence[Item] = ()) -> Timeline | None:
    """The aligned, checked timeline of ``run_id`` from a runtime's stores, or None if unknown
    (``known_checkpoints``: the run's checkpoint items from an earlier call, see ``checkpoint_items``)."""
    from agentkeel.runtime.divergence import check

    record = await runtime.store.get(run_id)
    if record is None:
        return None
    events = await runtime.journal.list(run_id)
    checkpoints = await checkpoint_items(runtime.checkpointer, record, known_checkpoints)
    stream, state, gaps = await stream_items(runtime.bridge, run_id)
    messages: list[BaseMessage] = []
    roots = [c for c in checkpoints if not c.data["namespace"]]
    if roots:
        accessor = await runtime.accessor(record.assistant_id)
        snapshot = await accessor.aget(record.thread_id, str(roots[-1].ident))
        if snapshot is not None:
            messages = list(snapshot.values.get("messages") or [])
    timeline = Timeline(record, events, checkpoints, stream, state, gaps, messages)
    timeline.items = align(events, checkpoints, stream)
    timeline.divergences = check(timeline)
    return timeline


__all__ = ["Divergence", "Item", "Timeline", "align", "attempts_of", "checkpoint_items", "load_timeline",
           "stream_items"]
