"""Durable context: what a run has already done, kept in graph state rather than in messages.

A long run's memory of its own work cannot live only in its messages: compaction takes messages
out of what the model is sent, and a lead that no longer sees its ``task`` calls delegates the same
research again (three batches of three overlapping subagents in DeerFlow's "analyze this paper"
incident). So four facts get channels of their own, next to ``messages``:

* ``delegations`` — the delegation ledger: one entry per ``task`` call, upserted by its tool-call id;
* ``skills`` — the skills the agent read (``/skills/<name>/SKILL.md``), with the text it read;
* ``compaction`` — the summary of the compacted messages and where the compaction cut the thread;
* ``original_request`` — the first thing the user asked in the thread.

Every reducer is a left fold of a per-item step, so it is deterministic and batching-invariant —
``r(r(s, xs), ys) == r(s, xs + ys)`` — by construction: that is what LangGraph's ``DeltaChannel``
requires when it replays stored writes in batches whose boundaries depend on where snapshots fell.
The bounds (the newest :data:`LEDGER_CAP` delegations, the :data:`SKILLS_CAP` most recent skills)
are applied inside the step, never after a batch, for the same reason.

None of these channels is a run input: a client cannot forge a ledger or a summary through a run's
``input`` (they are ``OmitFromInput``); they are written by the middleware and by the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

# pydantic describes a TypedDict only from typing_extensions on Python < 3.12 (the gateway's state
# schema of every agent graph holds these channels).
from typing_extensions import TypedDict

DelegationStatus = Literal["in_progress", "completed", "failed", "cancelled", "timed_out", "capped"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "timed_out", "capped"})

E = TypeVar("E")

LEDGER_CAP = 50
"""Delegations kept per thread (the oldest first-seen entry goes first)."""

SKILLS_CAP = 8
"""Loaded skills kept per thread (the least recently read goes first)."""


class DelegationEntry(TypedDict, total=False):
    """One ``task`` call and what became of it."""

    id: str  # the task tool call's id: the upsert key
    run_id: str | None  # the run that made the call (kept from the first sighting)
    message_id: str | None  # the AI message that carries the call
    description: str
    subagent_type: str
    status: str  # a DelegationStatus
    stop_reason: str | None
    result_brief: str | None
    result_sha256: str | None
    created_at: str  # ISO 8601, UTC (kept from the first sighting)


class SkillEntry(TypedDict, total=False):
    """A skill the agent read: enough to put it back in front of the model after compaction."""

    name: str  # the dedupe key
    path: str  # /skills/<name>/SKILL.md
    description: str
    sha256: str
    body: str  # the text read (bounded)
    message_id: str | None  # the ToolMessage of the read
    tool_call_id: str | None


class Compaction(TypedDict, total=False):
    """The summary of ``messages[:compacted]``: the model is sent it instead of those messages."""

    summary: str
    compacted: int  # how many leading messages the summary stands for: only ever grows …
    generation: int  # … within a generation: a new one starts when the cut no longer fits the thread
    through_id: str  # the id of the last compacted message (checks the cut still fits the thread)
    model: str | None  # the model that wrote the summary
    at: str  # ISO 8601, UTC


class OriginalRequest(TypedDict, total=False):
    """The thread's first user message (bounded), kept for the model after it is compacted."""

    id: str
    text: str


def is_terminal(status: str | None) -> bool:
    return status in TERMINAL_STATUSES


def _items(update: Any) -> list[Any]:
    if update is None:
        return []
    if isinstance(update, dict):
        return [update]
    return list(update)


def _batch(writes: Sequence[Any]) -> Iterator[Any]:
    """The items of a batch of channel writes, in order (each write one item or a list)."""
    for write in writes:
        yield from _items(write)


def _fold(step: Callable[[list[E], E], list[E]], current: Sequence[E] | None, items: Iterable[Any]) -> list[E]:
    """``step`` folded over ``items`` from ``current``: the one shape of every list reducer here."""
    entries = list(current or [])
    for item in items:
        entries = step(entries, item)
    return entries


# -- delegations ---------------------------------------------------------------------------

_KEPT_FROM_FIRST = ("run_id", "created_at", "message_id")


def _delegation_step(entries: list[DelegationEntry], update: DelegationEntry) -> list[DelegationEntry]:
    key = update.get("id")
    if not isinstance(key, str) or not key:
        return entries
    for index, old in enumerate(entries):
        if old.get("id") != key:
            continue
        merged: dict[str, Any] = dict(old)
        for field, value in dict(update).items():
            if value is None or (field in _KEPT_FROM_FIRST and old.get(field) is not None):
                continue
            merged[field] = value
        if is_terminal(old.get("status")) and not is_terminal(merged.get("status")):
            merged["status"] = old["status"]  # a terminal status is never downgraded
        out = list(entries)
        out[index] = DelegationEntry(**merged)  # type: ignore[typeddict-item]
        return out
    return [*entries, update][-LEDGER_CAP:]


def merge_delegations(current: Sequence[DelegationEntry] | None, update: Any) -> list[DelegationEntry]:
    """Upsert ``update`` (one entry or a list) into the ledger, entry by entry; see the module
    docstring for why this is a fold."""
    return _fold(_delegation_step, current, _items(update))


def delegations_delta(current: Sequence[DelegationEntry] | None, writes: Sequence[Any]) -> list[DelegationEntry]:
    """:func:`merge_delegations` over a batch of channel writes (the ``DeltaChannel`` signature)."""
    return _fold(_delegation_step, current, _batch(writes))


def closing_updates(
    entries: Iterable[DelegationEntry], *, reason: str, run_id: str | None = None, status: str = "cancelled",
    keep_run: str | None = None,
) -> list[DelegationEntry]:
    """The updates that close every ``in_progress`` entry (of ``run_id`` when given; never of
    ``keep_run``): a stopped run's delegations are over, whatever their subagents were doing."""
    return [
        {"id": e["id"], "status": status, "stop_reason": reason}
        for e in entries
        if e.get("status") == "in_progress" and e.get("id")
        and (run_id is None or e.get("run_id") == run_id)
        and (keep_run is None or e.get("run_id") != keep_run)
    ]


# -- skills --------------------------------------------------------------------------------


def _skill_step(entries: list[SkillEntry], update: SkillEntry) -> list[SkillEntry]:
    name = update.get("name")
    if not isinstance(name, str) or not name:
        return entries
    return [*(e for e in entries if e.get("name") != name), update][-SKILLS_CAP:]


def merge_skills(current: Sequence[SkillEntry] | None, update: Any) -> list[SkillEntry]:
    """Add the read skill(s) in ``update``: one entry per name, the most recent read last."""
    return _fold(_skill_step, current, _items(update))


def skills_delta(current: Sequence[SkillEntry] | None, writes: Sequence[Any]) -> list[SkillEntry]:
    """:func:`merge_skills` over a batch of channel writes (the ``DeltaChannel`` signature)."""
    return _fold(_skill_step, current, _batch(writes))


# -- compaction and the original request ------------------------------------------------------


def _reach(compaction: Compaction) -> tuple[int, int]:
    return int(compaction.get("generation") or 0), int(compaction.get("compacted") or 0)


def merge_compaction(current: Compaction | None, update: Compaction | None) -> Compaction | None:
    """The compaction that reaches further; a write that does not move the cut forward is ignored,
    so the summary the model sees changes only when more of the thread is compacted.

    The cut is forward-only within a ``generation``. When the thread no longer holds the messages
    a compaction stood for (an edit removed them), the next compaction starts generation + 1,
    so the thread can be compacted again instead of being stuck behind a cut that cannot fit."""
    if not update:
        return current or None
    if not current or _reach(update) > _reach(current):
        return update
    return current


def merge_original_request(current: OriginalRequest | None, update: OriginalRequest | None) -> OriginalRequest | None:
    """The first request stands."""
    return current if current else (update or None)


def durable_values(state: Any) -> dict[str, Any]:
    """The durable channels of a graph state (missing ones as empty values)."""
    get = state.get if isinstance(state, dict) else (lambda k, d=None: getattr(state, k, d))
    return {
        "delegations": list(get("delegations", None) or []),
        "skills": list(get("skills", None) or []),
        "compaction": get("compaction", None) or None,
        "original_request": get("original_request", None) or None,
    }


__all__ = [
    "LEDGER_CAP",
    "SKILLS_CAP",
    "TERMINAL_STATUSES",
    "Compaction",
    "DelegationEntry",
    "DelegationStatus",
    "OriginalRequest",
    "SkillEntry",
    "closing_updates",
    "delegations_delta",
    "durable_values",
    "is_terminal",
    "merge_compaction",
    "merge_delegations",
    "merge_original_request",
    "merge_skills",
    "skills_delta",
]
