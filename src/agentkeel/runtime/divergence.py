"""Divergence checks over one run's aligned timeline: where the surfaces disagree, or have holes.

Each check names a fact the runtime guarantees, so a flag means a bug, a lost write or an edited
store — never a normal run:

``stream_after_end``      a stream event stamped after the run's ``run.end`` (END is published
                          last, only once the terminal record is durable);
``result_without_call``   a journaled lead tool result whose call is in no checkpointed assistant
                          message (a result must answer a call the thread holds);
``intent_without_result`` a tool intent with no result while the run ended cleanly (not an
                          interrupted or recovered run, where an intent may be all that is left);
``stop_after_terminal``   a stop reason journaled after the run's first ``run.end``;
``terminal_mismatch``     the journal's ``run.end`` status is not the run record's status;
``grammar``               the thread's checkpointed history breaks a strict provider's request
                          grammar (``harness/scripted/strict.py``: the rule and the message index);
``journal_gap``           seqs missing from the journal (1..last must all be there);
``attempt_gap``           an attempt number skipped, or an event stamped with an attempt that
                          never began;
``stream_gap``            events the stream trimmed or lost (its ``gap`` markers; not the jump to a
                          recovered attempt's first event, which continues after the lost owner's);
``checkpoint_gap``        the run's root checkpoints skip a superstep;
``ahead_of_journal``      a checkpoint or stream event of an ended run stamped with a journal seq
                          the journal does not hold (journal records lost after the fact).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage

from agentkeel.harness.scripted.errors import StrictRequestError
from agentkeel.harness.scripted.strict import check_request
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.timeline import Divergence, Timeline


def check(timeline: Timeline) -> list[Divergence]:
    events = sorted(timeline.events, key=lambda e: e.seq)
    found: list[Divergence] = []
    found += _ends(timeline, events)
    found += _tool_results(timeline, events)
    found += _grammar(timeline)
    found += _gaps(timeline, events)
    return found


def _first_end(events: list[JournalEvent]) -> JournalEvent | None:
    return next((e for e in events if e.kind == "run.end"), None)


def _ends(timeline: Timeline, events: list[JournalEvent]) -> list[Divergence]:
    found: list[Divergence] = []
    end = _first_end(events)
    if end is None:
        if timeline.record.status.terminal:
            found.append(Divergence("terminal_mismatch", f"the run is {timeline.record.status.value} but "
                                    "its journal has no run.end"))
        return found
    if end.data.get("status") != timeline.record.status.value:
        found.append(Divergence("terminal_mismatch", f"run.end says {end.data.get('status')!r}, the run record "
                                f"{timeline.record.status.value!r}", end.seq))
    for event in events:
        if event.kind == "stop_reason" and event.seq > end.seq:
            found.append(Divergence("stop_after_terminal", f"stop reason {event.data.get('code')!r} journaled "
                                    f"after the terminal run.end (seq {end.seq})", event.seq))
    for item in timeline.stream:
        if item.journal_seq >= end.seq and (item.attempt is None or item.attempt == end.attempt):
            found.append(Divergence("stream_after_end", f"stream event {item.ident} ({item.kind}) was published "
                                    f"after run.end (seq {end.seq})", item.journal_seq))
    return found


def _tool_results(timeline: Timeline, events: list[JournalEvent]) -> list[Divergence]:
    found: list[Divergence] = []
    if not timeline.messages:
        return found  # no checkpoint of this run to check against
    called = {str(c.get("id")) for m in timeline.messages if isinstance(m, AIMessage)
              for c in [*m.tool_calls, *m.invalid_tool_calls]}
    results = {str(e.data.get("call_id")) for e in events if e.kind == "tool.call"}
    for event in events:
        if event.kind == "tool.call" and event.caller == "lead" and str(event.data.get("call_id")) not in called:
            found.append(Divergence("result_without_call", f"tool result {event.data.get('call_id')!r} "
                                    f"({event.data.get('name')}) answers no checkpointed call", event.seq))
    clean = timeline.record.status == RunStatus.success and not any(e.kind == "run.recovered" for e in events)
    for event in events:
        if clean and event.kind == "tool.intent" and str(event.data.get("call_id")) not in results:
            found.append(Divergence("intent_without_result", f"tool call {event.data.get('call_id')!r} "
                                    f"({event.data.get('name')}) was about to run but has no result", event.seq))
    return found


def _grammar(timeline: Timeline) -> list[Divergence]:
    messages = list(timeline.messages)
    if messages and isinstance(messages[-1], AIMessage) and messages[-1].tool_calls:
        messages.pop()  # calls still pending (a clarification question, a cut-off run): the next run answers them
    if not messages:
        return []
    try:
        check_request(messages)
    except StrictRequestError as exc:
        return [Divergence("grammar", f"the checkpointed history breaks the request grammar: {exc}")]
    return []


def _gaps(timeline: Timeline, events: list[JournalEvent]) -> list[Divergence]:
    found: list[Divergence] = []
    seqs = [e.seq for e in events]
    last = seqs[-1] if seqs else 0
    # A child's stop reason takes a seq when it is recorded and is journaled at the run's own
    # seq, naming the first as ``subagent_seq`` (a grandchild's inside its parent's, and in the
    # ``stop_reasons`` of their ``subagent.end``): those seqs are explained, not lost.
    reserved: set[int] = set()
    for event in events:
        if event.kind in ("stop_reason", "subagent.end"):
            _reserved_in(event.data, reserved)
    missing = sorted(set(range(1, last + 1)) - set(seqs) - reserved)
    if missing:
        found.append(Divergence("journal_gap", f"journal seqs missing: {_ranges(missing)}", missing[0]))
    begun = sorted({e.attempt for e in events if e.kind in ("run.start", "run.recovered") and e.attempt is not None})
    if begun and begun != list(range(begun[0], begun[-1] + 1)):
        found.append(Divergence("attempt_gap", f"attempts that began: {begun}"))
    for event in events:
        if event.attempt is not None and begun and event.attempt not in begun and event.kind != "run.end":
            found.append(Divergence("attempt_gap", f"{event.kind} is stamped with attempt {event.attempt}, "
                                    "which never began", event.seq))
    # A recovered attempt continues the stream after the lost owner's numbering, which its new
    # process cannot know: the jump to its first event is the lost attempt's part, not a loss.
    recovered = {e.attempt for e in events if e.kind == "run.recovered"}
    resumed_at = {next((i.ident for i in timeline.stream if i.attempt == a), None) for a in recovered}
    for gap in timeline.stream_gaps:
        if gap.get("resumed_at") in resumed_at:
            continue
        found.append(Divergence("stream_gap", f"the stream lost {gap.get('missed')} event(s) after "
                                f"{gap.get('requested_after')}"))
    steps = [c.step for c in timeline.checkpoints if not c.data["namespace"] and isinstance(c.step, int)]
    for before, after in zip(steps, steps[1:], strict=False):
        if after > before + 1:
            found.append(Divergence("checkpoint_gap", f"checkpoints jump from step {before} to step {after}"))
    # While the run goes on, its newest records may still be in the writer's buffer (at most
    # ``limits.journal_flush_ms`` old): being ahead of the stored journal only counts once it ended.
    for item in [*timeline.checkpoints, *timeline.stream] if timeline.record.status.terminal else []:
        if item.journal_seq > last:
            found.append(Divergence("ahead_of_journal", f"{item.source} {item.ident} is stamped after journal seq "
                                    f"{item.journal_seq}, but the journal ends at {last}", item.journal_seq))
    return found


def _reserved_in(value: Any, into: set[int]) -> None:
    """Every ``subagent_seq``, and every ``seq`` of a child's stop reason, anywhere in ``value``."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "subagent_seq" and isinstance(inner, int):
                into.add(inner)
            elif key == "stop_reasons" and isinstance(inner, list):
                into.update(r["seq"] for r in inner if isinstance(r, dict) and isinstance(r.get("seq"), int))
            _reserved_in(inner, into)
    elif isinstance(value, list):
        for inner in value:
            _reserved_in(inner, into)


def _ranges(numbers: list[int]) -> str:
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


__all__ = ["check"]
