"""Following a run: the bridge's stream, with the durable run record as the backstop.

A stream is retained for a short grace after END and then reaped. An observer that arrives later
(or whose stream is reaped under it) is answered at once from the run record — one ``run_record``
event and END — instead of heart-beating forever on a stream that will never end. If it asked for
history it had not read, a ``gap`` comes first (``missed`` is exact when the bridge still knows
the stream's last seq, ``null`` when it does not), so the reap is never a silent truncation.

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
from typing import Protocol

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
from agentkeel.runtime.stores.base import RunStore

log = logging.getLogger(__name__)

RUN_RECORD_EVENT = "run_record"
_DRAIN_WAIT_S = 0.01  # how long the final read waits for events the stream may still hold


class _Observable(Protocol):
    store: RunStore
    bridge: StreamBridge


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
    """The record and END; first a ``gap`` for the events after ``after`` this observer will never
    read (``None``: it asked for none it had not read)."""
    record = await runtime.store.get(run_id)
    if record is not None:
        final = None if after is None else await runtime.bridge.final_seq(run_id)
        if after is not None and (final is None or final > after):
            missed = None if final is None else final - after
            resumed = None if final is None else final + 1
            yield StreamEvent("", after, GAP_EVENT, {"requested_after": after, "resumed_at": resumed, "missed": missed})
        yield StreamEvent("", 0, RUN_RECORD_EVENT, record.to_dict())
    yield StreamEvent("", 0, END_EVENT, None)
