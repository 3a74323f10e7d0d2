"""Following a run: the bridge's stream, with the durable run record as the backstop.

A stream is retained for a while after END and then reaped. An observer that arrives later (or
whose stream is reaped under it) is answered at once from the run record — one ``run_record``
event and END — instead of heart-beating forever on a stream that will never end.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from agentkeel.runtime.bridge import END_EVENT, EventKind, StreamBridge, StreamEvent, StreamGone
from agentkeel.runtime.stores.base import RunStore

RUN_RECORD_EVENT = "run_record"


class _Observable(Protocol):
    store: RunStore
    bridge: StreamBridge


async def observe(
    runtime: _Observable, run_id: str, *, last_event_id: str | None = None, heartbeat_s: float | None = None
) -> AsyncIterator[StreamEvent]:
    """Every item of the run's stream after ``last_event_id`` (heartbeats, gaps, END last).

    Raises ``InvalidEventId`` for a malformed cursor before anything is yielded.
    """
    stream = runtime.bridge.subscribe(run_id, last_event_id=last_event_id, heartbeat_s=heartbeat_s)
    if not await runtime.bridge.exists(run_id) and await _answer_from_record(runtime, run_id):
        async for item in _from_record(runtime, run_id):
            yield item
        return
    try:
        async with contextlib.aclosing(stream) as items:
            async for item in items:
                yield item
                if item.kind is EventKind.end:
                    return
                if item.kind is EventKind.heartbeat and not await runtime.bridge.exists(run_id):
                    if await _answer_from_record(runtime, run_id):
                        break
            else:
                return
    except StreamGone:
        pass
    async for item in _from_record(runtime, run_id):
        yield item


async def _answer_from_record(runtime: _Observable, run_id: str) -> bool:
    record = await runtime.store.get(run_id)
    return record is None or record.status.terminal


async def _from_record(runtime: _Observable, run_id: str) -> AsyncIterator[StreamEvent]:
    record = await runtime.store.get(run_id)
    if record is not None:
        yield StreamEvent("", 0, RUN_RECORD_EVENT, record.to_dict())
    yield StreamEvent("", 0, END_EVENT, None)
