"""The run page's step waterfall: the rows drawn from a run's aligned timeline (``runtime/timeline.py``).

The aligned timeline decides what happened and in which order — journal records, the run's
checkpoints and what its stream still retains on one axis, each child's records nested under its
``subagent.start``, file changes folded into the tool calls that made them. This module only
places those items in time and gives each a label; it decides no order and no ownership itself.

Placement in time: a journal record carries the moment it was written. A model call's record is
written when the call returned, so it spans ``ts - latency_ms`` to ``ts``; a tool call likewise
with ``duration_ms``; a subagent spans its start and end records; everything else is a point. A
checkpoint and a stream event carry no clock of their own that the journal agrees with, only the
journal seq they follow: they are drawn at that record's moment (a run of consecutive stream
events is one row, from the first one's record to the last one's). Times are milliseconds from
the run's start.

Nesting: a row's ``parent`` is the row it is drawn under — a child's records under its subagent
row (as the aligned timeline nests them), a file change under its tool call, and each subagent
row under the ``task`` call that started it (the call's id is the child's ``task_id``; its record
is written when it returns, after the child's, so it is matched once all rows are known).

Divergences (``runtime/divergence.py``) are marked on the row they name: a stream event after END
or a record ahead of the journal on the stream or checkpoint row at that seq, any other on the
journal record with that seq.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from agentkeel.runtime.timeline import CHECKPOINT, JOURNAL, STREAM, Item, Timeline

SURFACE_CODES = {"stream_after_end", "ahead_of_journal"}  # divergences about a checkpoint or stream item
COMPACTION_CALLER = "middleware:summarization"


def waterfall(timeline: Timeline, origin: datetime) -> list[dict[str, Any]]:
    """The rows in timeline order (an item before its children), each with ``parent``."""
    placer = _Placer(timeline, origin)
    rows: list[dict[str, Any]] = []
    placer.walk(timeline.items, None, rows)
    tasks = {row["call_id"]: row["id"] for row in rows if row["kind"] == "tool" and row.get("call_id")
             and row["detail"].get("name") == "task"}
    for row in rows:
        if row["kind"] == "subagent" and row["task_id"] in tasks:
            row["parent"] = tasks[row["task_id"]]
    return rows


def is_compaction(caller: str | None) -> bool:
    """A summary call of the compaction middleware (drawn apart on the context chart)."""
    return (caller or "").startswith(COMPACTION_CALLER)


class _Placer:
    """Turns aligned items into rows: their moments (by journal seq), subagent ends, divergence marks."""

    def __init__(self, timeline: Timeline, origin: datetime) -> None:
        self.origin = origin
        self.moments = {e.seq: e.ts for e in timeline.events}
        self.ends = {str(e.data.get("task_id")): self.ms(e.ts) for e in timeline.events
                     if e.kind == "subagent.end" and e.data.get("task_id")}
        self.flags: dict[tuple[bool, int], list[str]] = {}
        for d in timeline.divergences:
            if d.journal_seq is not None:
                self.flags.setdefault((d.code in SURFACE_CODES, d.journal_seq), []).append(d.code)

    def ms(self, moment: datetime | None) -> float | None:
        return None if moment is None else round((moment - self.origin).total_seconds() * 1000, 1)

    def at(self, seq: int) -> float | None:
        """The moment of journal record ``seq`` (0: before the first record; None: a seq the journal lacks)."""
        return 0.0 if seq == 0 else self.ms(self.moments.get(seq))

    def walk(self, items: list[Item], parent: str | None, rows: list[dict[str, Any]]) -> None:
        stream: list[Item] = []
        for item in [*items, None]:
            if item is not None and item.source == STREAM:
                stream.append(item)
                continue
            if stream:
                rows.append(self.stream_row(stream, parent))
                stream = []
            if item is None:
                break
            row = self.row(item, parent)
            rows.append(row)
            for index, change in enumerate(item.files):
                rows.append(self.base(item, f"{row['id']}f{index}", row["id"]) | {
                    "kind": "file", "label": f"{change.get('change')} {change.get('path')}", "start_ms": row["end_ms"],
                    "detail": dict(change)})
            self.walk(item.children, row["id"], rows)

    def base(self, item: Item, ident: str, parent: str | None) -> dict[str, Any]:
        at = self.at(item.journal_seq)
        flags = self.flags.get((item.source != JOURNAL, item.journal_seq), [])
        return {"id": ident, "seq": item.journal_seq, "source": item.source, "caller": item.caller or "lead",
                "attempt": item.attempt, "step": item.step, "parent": parent, "start_ms": at, "end_ms": at,
                "status": "ok", "divergences": list(flags)}

    def stream_row(self, items: list[Item], parent: str | None) -> dict[str, Any]:
        first, last = items[0], items[-1]
        names = Counter(i.kind for i in items)
        span = f"#{first.ident}" if first.ident == last.ident else f"#{first.ident}–#{last.ident}"
        what = ", ".join(f"{name}×{count}" if count > 1 else name for name, count in names.items())
        row = self.base(first, f"e{first.ident}", parent)
        row["divergences"] = sorted({c for i in items for c in self.flags.get((True, i.journal_seq), [])})
        return row | {"kind": "stream", "caller": "stream", "label": f"stream {span}: {what}",
                      "end_ms": self.at(last.journal_seq), "detail": {"events": len(items), "kinds": dict(names)}}

    def row(self, item: Item, parent: str | None) -> dict[str, Any]:
        if item.source == CHECKPOINT:
            d = item.data
            ns = f" ns {d['namespace']}" if d.get("namespace") else ""
            return self.base(item, f"c{item.ident}", parent) | {
                "kind": "checkpoint", "caller": "checkpoint", "detail": dict(d),
                "label": f"checkpoint step {item.step} ({d.get('source')}{ns}) {str(item.ident)[:13]}"}
        row = self.base(item, f"s{item.journal_seq}", parent)
        return row | _journal(item, row["end_ms"], self.ends)


def _journal(item: Item, end: float | None, ends: dict[str, float | None]) -> dict[str, Any]:
    """Kind, label, span, status and detail of a journal record's row."""
    d, kind = item.data, item.kind
    if kind in ("model.call", "model.error"):
        what = "compaction summary" if is_compaction(item.caller) else "model"
        label = (f"{what} {d.get('model') or '?'}: {d.get('input_tokens') or 0} in / {d.get('output_tokens') or 0} out"
                 if kind == "model.call" else f"model error: {d.get('error_type')} {d.get('kind') or ''}".strip())
        detail = {k: d.get(k) for k in ("model", "input_tokens", "output_tokens", "latency_ms", "finish_reason",
                                        "estimated", "error_type", "message") if k in d}
        return {"kind": "model", "label": label, "start_ms": _before(end, d.get("latency_ms")),
                "status": "ok" if kind == "model.call" else "error", "detail": detail}
    if kind == "tool.call":
        return {"kind": "tool", "label": f"tool {d.get('name')}", "start_ms": _before(end, d.get("duration_ms")),
                "status": str(d.get("status") or "ok"), "call_id": d.get("call_id"), "detail": dict(d)}
    if kind == "subagent.start":
        done = d.get("end") or {}
        task = str(d.get("task_id") or f"seq-{item.journal_seq}")
        return {"kind": "subagent", "label": f"subagent {d.get('subagent_type')}: {d.get('description') or ''}".strip(),
                "task_id": task, "end_ms": ends.get(task) if done else None,
                "status": str(done.get("status") or "unknown") if done else "running",
                "detail": {**{k: d.get(k) for k in ("task_id", "subagent_type", "description", "model", "depth")},
                           **{k: done.get(k) for k in ("stop_reason", "usage", "turns", "error")}}}
    labels = {
        "intervention": f"guard {d.get('middleware')}: {d.get('action')}",
        "stop_reason": f"stop reason {d.get('code')}",
        "compaction": (f"compaction: request {d.get('request_messages_before')}→{d.get('request_messages_after')} messages, "
                       f"{d.get('request_tokens_before')}→{d.get('request_tokens_after')} tokens"),
        "run.start": f"attempt {d.get('attempt') or item.attempt} started by {d.get('owner')}"
                     + (f" (resumed from attempt {d.get('resumed_from')})" if d.get("resumed_from") else ""),
        "run.recovered": (f"recovered: attempt {d.get('lost_attempt')} of {d.get('lost_owner')} lost → attempt "
                          f"{d.get('attempt')} ({d.get('policy')})"),
        "run.end": f"run ended {d.get('status')}" + (f": {d.get('error')}" if d.get("error") else ""),
        "chain.manifest": f"guard chain: {len(d.get('order') or [])} guards",
        "file.changed": f"{d.get('change')} {d.get('path')} (no tool call reported it)",
    }
    names = {"file.changed": "file", "run.start": "attempt", "run.recovered": "recovery", "chain.manifest": "manifest"}
    status = "error" if kind == "run.end" and d.get("status") != "success" else "ok"
    return {"kind": names.get(kind, kind.replace(".", "-")), "label": labels.get(kind, kind), "status": status,
            "detail": dict(d)}


def _before(end: float | None, took_ms: Any) -> float | None:
    return None if end is None else round(max(end - float(took_ms or 0), 0.0), 1)
