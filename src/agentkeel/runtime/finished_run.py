"""A run's journal as the run finished it: what a recovered run's lost attempts did that the
attempts after them did again is left out.

Why: a run recovered after its worker died (``on_worker_lost: resume``) continues under a new
attempt from its last checkpoint. The lost attempt's work up to that checkpoint stands — its model
answers are in the thread's history and are not asked for again — but the step it was in when it
died is executed again (LangGraph re-runs each task of the step that left no pending write). The
journal keeps both: the lost attempt's records of that step *and* the new attempt's. An export or
a re-run that took every record would ask the model twice for what the finished run asked once, and
answer a tool call with the lost attempt's result instead of the one the run went on with.

What counts as done again: each record belongs to one unit of work —

* a subagent's record (it names a ``task_id``) to its task, i.e. the lead's ``task`` call;
* a tool call's records (``tool.intent``, ``tool.call``, a guard's intervention naming a
  ``tool_call_id``) to that call;
* anything else the lead did to the lead's superstep (its model calls, its guards' records).

A lost attempt's record is superseded when a later attempt journaled a record of the same unit: the
same task (its child ran again, or the recovery answered its ``task`` call), the same call (it ran
again, or the recovery answered it with "outcome unknown"), the same lead superstep (the step ran
again). Steps completed before the loss never appear in a later attempt (it starts after them), so
they are kept whole; so is a task or call of the interrupted step that finished and left its pending
write (LangGraph does not run it again). The worker's own records of a lost attempt (its
``run.start``, its guard-chain manifest) and the ``run.recovered`` records are not the run's work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentkeel.runtime.stores.base import JournalEvent

RECOVERED_CALL = "recovered_call"  # the SideEffectLedger's intervention for a call it did not repeat
_WORKER_KINDS = frozenset({"run.start", "chain.manifest", "run.recovered"})


def final_attempt(events: Iterable[JournalEvent]) -> int | None:
    """The highest attempt that journaled anything (None: no record names an attempt)."""
    attempts = [e.attempt for e in events if e.attempt is not None]
    return max(attempts) if attempts else None


def is_multi_attempt(events: Iterable[JournalEvent]) -> bool:
    return len({e.attempt for e in events if e.attempt is not None}) > 1


def as_finished(events: Iterable[JournalEvent]) -> list[JournalEvent]:
    """``events`` in seq order without what a later attempt did again (see the module docstring)
    and without the lost attempts' worker records and the recoveries."""
    ordered = sorted(events, key=lambda e: e.seq)
    last = final_attempt(ordered)
    if last is None or not is_multi_attempt(ordered):
        return ordered
    redone: dict[int, set[Any]] = {}  # attempt -> the units every later attempt touched
    touched_after: set[Any] = set()
    for attempt in sorted({e.attempt for e in ordered if e.attempt is not None}, reverse=True):
        redone[attempt] = set(touched_after)
        touched_after |= {unit for e in ordered if e.attempt == attempt for unit in _touches(e)}
    kept: list[JournalEvent] = []
    for event in ordered:
        if event.kind == "run.recovered":
            continue
        lost = event.attempt is not None and event.attempt < last
        if lost and (event.kind in _WORKER_KINDS or _unit(event) in redone[event.attempt or 0]):
            continue
        kept.append(event)
    return kept


def recovered_calls(events: Iterable[JournalEvent]) -> dict[str, str]:
    """Call id -> note of every call a recovered attempt answered with "outcome unknown" instead of
    running it (the ``RunContext.recovered_calls`` that makes a re-run answer them the same way)."""
    return {str(e.data["tool_call_id"]): str(e.data.get("note") or "") for e in events
            if e.kind == "intervention" and e.data.get("action") == RECOVERED_CALL and e.data.get("tool_call_id")}


def _unit(event: JournalEvent) -> Any:
    data = event.data
    if data.get("task_id"):
        return ("call", str(data["task_id"]))
    call = data.get("call_id") or data.get("tool_call_id")
    if call:
        return ("call", str(call))
    return ("lead", event.step)


def _touches(event: JournalEvent) -> set[Any]:
    """The units a later attempt's record shows were worked on again."""
    if event.kind in _WORKER_KINDS or event.kind == "run.end" or event.caller == "worker":
        return set()  # the worker's records and the end are stamped with a step they did not work in
    data = event.data
    units = {("call", str(data[key])) for key in ("task_id", "call_id", "tool_call_id") if data.get(key)}
    return units or {("lead", event.step)}


__all__ = ["RECOVERED_CALL", "as_finished", "final_attempt", "is_multi_attempt", "recovered_calls"]
