"""Following a run: the bridge's stream, with the durable run record as the backstop.

A stream is retained for a short grace after END and then reaped. An observer that arrives later
(or whose stream is reaped under it) is answered at once from the durable record instead of
heart-beating forever on a stream that will never end. If it asked for history it had not read,
it gets a ``gap`` first, then the run's final state as one ``values`` event, then the record (one
``run_record`` event) and END: the reap is never a silent truncation, and a client that renders
the last ``values`` shows what the run ended with. ``missed`` is exact when the bridge still knows
the stream's last seq (memory) or the run's ``run.end`` journal event recorded it (every run ended
by this version, on any bridge), ``null`` when neither does. The final ``values`` come from the
thread's head checkpoint, and only when that checkpoint is this run's own and the run ended
``success`` or ``interrupted`` (never a failed run's last checkpoint as if it had succeeded, never
a later run's state); otherwise the record alone answers.

The record is also consulted at every heartbeat: a stream can lose its END (Redis was down when
it was published) or its key (deleted, expired, lost in a restart) while the run goes on or
finishes elsewhere. A terminal record then ends the observer within one heartbeat, after reading
whatever the stream still holds. A stream that vanished under a run that is still going is
followed again from the observer's position: the publisher recreates it with the next seqs, so
the observer sees a ``gap`` rather than ending early.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from agentkeel.runtime.bridge import (
    END_EVENT,
    GAP_EVENT,
    LIVE,
    BridgeFault,
    EventKind,
    StreamBridge,
    StreamEvent,
    StreamGone,
    format_event_id,
    parse_event_id,
)
from agentkeel.runtime.checkpoints import StateAccessor
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.serialization import to_jsonable
from agentkeel.runtime.stores.base import JournalStore, RunStore

log = logging.getLogger(__name__)

RUN_RECORD_EVENT = "run_record"
FINAL_VALUES_EVENT = "values"
_FINAL_VALUES_STATUSES = frozenset({RunStatus.success, RunStatus.interrupted})
_DRAIN_WAIT_S = 0.01  # how long the final read waits for events the stream may still hold


class _Observable(Protocol):
    store: RunStore
    journal: JournalStore
    bridge: StreamBridge

    async def accessor(self, assistant_id: str = ...) -> StateAccessor: ...


async def observe(
    runtime: _Observable, run_id: str, *, last_event_id: str | None = None, heartbeat_s: float | None = None
) -> AsyncIterator[StreamEvent]:
    """Every item of the run's stream after ``last_event_id`` (heartbeats, gaps, END last; or a
    ``cursor_ahead`` error last).

    Raises ``InvalidEventId`` for a malformed cursor and ``TooManySubscribers`` when the process
    is full, before anything is yielded.
    """
    bridge = runtime.bridge
    stream = bridge.subscribe(run_id, last_event_id=last_event_id, heartbeat_s=heartbeat_s)
    wait_s = bridge.heartbeat_s if heartbeat_s is None else heartbeat_s
    after = parse_event_id(last_event_id)  # checked by ``subscribe``; None: only live events
    cursor: int | None = None  # the position of the last item yielded
    if not await _exists(bridge, run_id) and await _answer_from_record(runtime, run_id):
        await stream.aclose()
        async for item in _from_record(runtime, run_id, after):
            yield item
        return
    gone = False
    following: AsyncGenerator[StreamEvent, None] | None = stream
    while following is not None:
        finished = False
        try:
            async with contextlib.aclosing(following) as items:
                async for item in items:
                    yield item
                    cursor = item.seq
                    if item.kind in (EventKind.end, EventKind.error):
                        return
                    if item.kind is EventKind.heartbeat and await _finished(runtime, run_id):
                        finished = True
                        break
        except StreamGone:
            finished = bridge.closed or await _answer_from_record(runtime, run_id)
            gone = finished
        except BridgeFault:  # the backend is unreachable: the record decides, or we try again
            finished = await _finished(runtime, run_id)
            if not finished:
                await asyncio.sleep(wait_s)
        following = None
        if not finished:  # vanished under a live run: follow its recreation from where we were
            resume = LIVE if cursor is None else format_event_id(cursor)
            following = bridge.subscribe(run_id, last_event_id=resume, heartbeat_s=heartbeat_s)
    if cursor is not None and not gone:
        for item in await _drain(bridge, run_id, cursor, wait_s):
            yield item
    async for item in _from_record(runtime, run_id, (cursor if cursor is not None else after) if gone else None):
        yield item


async def _exists(bridge: StreamBridge, run_id: str) -> bool:
    """Whether the run has a stream; when the backend cannot say, assume so and let the
    subscription (which outlives outages) and the record decide."""
    try:
        return await bridge.exists(run_id)
    except bridge.faults as exc:
        log.debug("run %s: checking its stream failed: %r", run_id, exc)
        return True


async def _finished(runtime: _Observable, run_id: str) -> bool:
    """Whether the record says the run is over; a store fault means "not known yet"."""
    try:
        return await _answer_from_record(runtime, run_id)
    except Exception as exc:
        log.debug("run %s: reading the run record failed: %r", run_id, exc)
        return False


async def _drain(bridge: StreamBridge, run_id: str, cursor: int, wait_s: float) -> list[StreamEvent]:
    """Data events (and gaps) the stream still holds after ``cursor``, read within one heartbeat:
    events published just before the record turned terminal are not lost to the race. Collected
    before they are yielded, so the time bound never cancels the consumer."""
    drained: list[StreamEvent] = []
    try:
        async with asyncio.timeout(wait_s):
            rest = bridge.subscribe(run_id, last_event_id=format_event_id(cursor), heartbeat_s=_DRAIN_WAIT_S)
            async with contextlib.aclosing(rest) as items:
                async for item in items:
                    if item.kind not in (EventKind.data, EventKind.gap):
                        break
                    drained.append(item)
    except Exception as exc:  # the record answers anyway
        log.debug("run %s: draining the stream failed: %r", run_id, exc)
    return drained


async def _answer_from_record(runtime: _Observable, run_id: str) -> bool:
    record = await runtime.store.get(run_id)
    return record is None or record.status.terminal


async def _from_record(runtime: _Observable, run_id: str, after: int | None) -> AsyncIterator[StreamEvent]:
    """The record and END; first, for an observer that will never read the events after ``after``
    (``None``: it asked for none it had not read), a ``gap`` and the run's final values."""
    record = await runtime.store.get(run_id)
    if record is not None:
        final = None if after is None else await _final_seq(runtime, run_id)
        if after is not None and (final is None or final > after):
            missed = None if final is None else final - after
            resumed = None if final is None else final + 1
            yield StreamEvent("", after, GAP_EVENT, {"requested_after": after, "resumed_at": resumed, "missed": missed})
            values = await _final_values(runtime, record)
            if values is not None:
                yield StreamEvent("", 0, FINAL_VALUES_EVENT, values)
        yield StreamEvent("", 0, RUN_RECORD_EVENT, record.to_dict())
    yield StreamEvent("", 0, END_EVENT, None)


async def _final_seq(runtime: _Observable, run_id: str) -> int | None:
    """The dropped stream's last seq: the bridge's memory of it, else the ``run.end`` journal
    event's ``stream_seq`` (durable, so it outlives the stream on every backend)."""
    final = await runtime.bridge.final_seq(run_id)
    if final is not None:
        return final
    try:
        ends = await runtime.journal.list(run_id, kinds=["run.end"])
    except Exception as exc:  # the gap is still said, with an unknown count
        log.debug("run %s: reading its run.end failed: %r", run_id, exc)
        return None
    seq = ends[-1].data.get("stream_seq") if ends else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


async def _final_values(runtime: _Observable, record: RunRecord) -> Any:
    """The thread's state as the run left it (what ``/wait`` answers), or ``None`` when it cannot
    be told apart from another run's or the run did not end well; never raises."""
    if record.status not in _FINAL_VALUES_STATUSES:
        return None
    try:
        snapshot = await (await runtime.accessor(record.assistant_id)).aget(record.thread_id)
    except Exception as exc:  # the record answers alone
        log.debug("run %s: reading its final state failed: %r", record.run_id, exc)
        return None
    if snapshot is None or (snapshot.metadata or {}).get("run_id") != record.run_id:
        return None  # a later run moved the thread on (or the thread is gone)
    values = to_jsonable(snapshot.values)
    if snapshot.interrupts and isinstance(values, dict):
        values["__interrupt__"] = to_jsonable(list(snapshot.interrupts))
    return values
