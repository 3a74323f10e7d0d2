"""The side-effect ledger of a recovered run: which tool calls an earlier attempt left unfinished.

The guarantee, for a run resumed after its worker was lost (``on_worker_lost: resume``):

* **idempotent tools are at-least-once.** A call that had started and has no result runs again
  when LangGraph resumes the tools step; the tool declared that this is harmless.
* **the others are never repeated blindly.** A call of a tool that is not idempotent (``bash``,
  ``write_file``, ``str_replace``, every tool that does not declare otherwise) whose intent was
  journaled without a result is answered, not run: the model is told that its outcome is unknown,
  that it was not repeated, and to check its effects before deciding to run it again.

It rests on two journal records per call: ``tool.intent``, written through before the tool runs
(``harness.middleware.side_effect_ledger``), and ``tool.call``, the result, journaled after it. A
crash can lose a buffered ``tool.call`` (at most the last flush interval), never an intent; a
call whose result was lost is then treated as unfinished, the safe side.

The worker, on a recovered attempt and before the graph runs::

    context = RunContext(..., recovered_calls=recovered_notes(await prior_calls(journal_store, run_id)))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from agentkeel.harness.middleware.side_effect_ledger import TOOL_INTENT
from agentkeel.runtime.stores.base import JournalEvent, JournalStore

TOOL_RESULT = "tool.call"
"""The journal kind of a tool call's result (``runtime.journal_callbacks``)."""


@dataclass(frozen=True)
class Intent:
    """A tool call an earlier attempt journaled the intent of, as of its latest intent record."""

    call_id: str
    name: str
    idempotent: bool
    attempt: int
    seq: int
    ts: datetime | None = None
    # The journaled result's status (ok | error | interrupted), None while there is none.
    result: str | None = None

    @classmethod
    def from_event(cls, event: JournalEvent) -> Intent:
        data = event.data
        attempt = data.get("attempt")
        return cls(
            call_id=str(data.get("call_id") or ""),
            name=str(data.get("name") or "unknown"),
            idempotent=data.get("idempotent") is True,
            attempt=attempt if isinstance(attempt, int) else 0,
            seq=event.seq,
            ts=event.ts,
        )


async def prior_calls(journal_store: JournalStore, run_id: str) -> dict[str, Intent]:
    """Every tool call of ``run_id`` with a journaled intent, by call id, with its result's status
    if one was journaled. Call it before the new attempt runs a tool: every intent in the journal
    then belongs to an earlier attempt. A call re-run by a later attempt counts from its latest
    intent."""
    events = await journal_store.list(run_id, kinds=[TOOL_INTENT, TOOL_RESULT])
    calls: dict[str, Intent] = {}
    for event in events:  # seq order: an intent precedes its result
        call_id = str(event.data.get("call_id") or "")
        if not call_id:
            continue
        if event.kind == TOOL_INTENT:
            calls[call_id] = Intent.from_event(event)
        elif call_id in calls:
            calls[call_id] = replace(calls[call_id], result=str(event.data.get("status") or "ok"))
    return calls


async def unfinished_calls(journal_store: JournalStore, run_id: str) -> dict[str, Intent]:
    """Tool calls of ``run_id`` with a journaled intent and no journaled result, by call id."""
    return {k: v for k, v in (await prior_calls(journal_store, run_id)).items() if v.result is None}


def recovered_notes(calls: Mapping[str, Intent]) -> dict[str, str]:
    """``RunContext.recovered_calls`` for ``calls`` (``prior_calls``): the calls that must not run
    again (not idempotent), each with what is known of it. Idempotent ones are left out: they
    re-run. A non-idempotent call whose result was journaled is included too: if LangGraph runs it
    again on resume, its result never reached a checkpoint, and running it again would repeat it."""
    return {call_id: _note(intent) for call_id, intent in calls.items() if not intent.idempotent}


def _note(intent: Intent) -> str:
    when = f" at {intent.ts.isoformat(timespec='seconds')}" if intent.ts is not None else ""
    done = "" if intent.result is None else f"; it ended ({intent.result}) but its result was lost"
    return f"started by attempt {intent.attempt}{when}, journal seq {intent.seq}{done}"


__all__ = ["TOOL_RESULT", "Intent", "prior_calls", "recovered_notes", "unfinished_calls"]
