"""In-process stream bridge: the embedded default and the unit-test backend.

Each run keeps a ``deque(maxlen=retention)`` of events (trimming is the deque's own eviction) and
an ``asyncio.Event`` that is set and replaced on every change, so waiting subscribers wake on
publish instead of polling, and a subscriber that grabbed the event before checking the state
cannot miss a wake-up (there is no ``await`` between the check and the grab).

Expiry is lazy and cheap: streams sit in an ``OrderedDict`` ordered by last write, and since every
stream expires ``ttl_s`` after its last write (END included), the reaper only ever looks at the
front. It runs on publish, subscribe, ``exists``, an idle subscriber's heartbeat and ``reap()``.

A subscriber of a run nobody has written to waits on a placeholder that is not a stream (``exists``
is false, it never expires) and disappears with its last subscriber, so subscribing cannot leave a
zombie stream behind.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import islice

from agentkeel.runtime.bridge.base import (
    READ_BATCH,
    Batch,
    Reader,
    StreamBridge,
    StreamClosed,
    StreamEvent,
    StreamGone,
    data_event,
)


@dataclass(eq=False)
class _Run:
    events: deque[StreamEvent]
    seq: int = 0
    ended: bool = False
    gone: bool = False
    touched: float = 0.0
    subscribers: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def mark_gone(self) -> None:
        self.gone = True
        self.notify()

    def batch_after(self, after: int) -> Batch:
        if self.gone:
            raise StreamGone("the stream was deleted or expired")
        start = max(0, after + 1 - self.events[0].seq) if self.events else 0
        items = list(islice(self.events, start, start + READ_BATCH))
        return Batch(items, self.ended and start + len(items) >= len(self.events), self.seq)


class _MemoryReader(Reader):
    def __init__(self, bridge: MemoryStreamBridge, run_id: str, run: _Run) -> None:
        self._bridge = bridge
        self._run_id = run_id
        self._run = run

    async def head(self) -> int | None:
        return None if self._bridge._waiting.get(self._run_id) is self._run else self._run.seq

    async def read(self, after: int, wait_s: float) -> Batch:
        batch = self._run.batch_after(after)
        if batch.events or batch.ended:
            return batch
        changed = self._run.changed
        try:
            async with asyncio.timeout(wait_s):
                await changed.wait()
        except TimeoutError:
            # An idle subscriber is the one place an abandoned stream would otherwise go unnoticed.
            self._bridge._reap()
        return self._run.batch_after(after)


class MemoryStreamBridge(StreamBridge):
    cross_process = False

    def __init__(
        self, *, retention: int, ttl_s: float, heartbeat_s: float, max_subscribers: int | None = None
    ) -> None:
        super().__init__(
            retention=retention, ttl_s=ttl_s, heartbeat_s=heartbeat_s, max_subscribers=max_subscribers
        )
        self._runs: OrderedDict[str, _Run] = OrderedDict()  # written streams, oldest write first
        self._waiting: dict[str, _Run] = {}  # placeholders of unwritten runs with subscribers

    async def _append(self, run_id: str, event: str, payload: str, floor: int, at: str = "") -> StreamEvent:
        run = self._writable(run_id)
        if run.ended:
            raise StreamClosed(f"stream {run_id!r} has ended")
        item = data_event(max(run.seq, floor) + 1, event, payload, at)
        run.seq = item.seq
        run.events.append(item)
        self._touch(run_id, run)
        return item

    async def _append_end(self, run_id: str, floor: int) -> None:
        run = self._writable(run_id)
        if not run.ended:
            run.seq = max(run.seq, floor)
            run.ended = True
            self._touch(run_id, run)

    def _writable(self, run_id: str) -> _Run:
        self._reap()
        return self._runs.get(run_id) or self._waiting.pop(run_id, None) or self._new_run()

    def _new_run(self) -> _Run:
        return _Run(deque(maxlen=self.retention))

    def _touch(self, run_id: str, run: _Run) -> None:
        run.touched = time.monotonic()
        self._runs[run_id] = run
        self._runs.move_to_end(run_id)
        run.notify()

    @asynccontextmanager
    async def _reader(self, run_id: str) -> AsyncIterator[Reader]:
        self._reap()
        run = self._runs.get(run_id)
        if run is None:
            run = self._waiting.setdefault(run_id, self._new_run())
        run.subscribers += 1
        try:
            yield _MemoryReader(self, run_id, run)
        finally:
            run.subscribers -= 1
            if run.subscribers == 0 and self._waiting.get(run_id) is run:
                del self._waiting[run_id]

    def _reap(self) -> int:
        cutoff = time.monotonic() - self.ttl_s
        removed = 0
        while self._runs:
            run_id, run = next(iter(self._runs.items()))
            if run.touched > cutoff:
                break
            self._drop(run_id)
            removed += 1
        return removed

    def _drop(self, run_id: str) -> None:
        self._runs.pop(run_id).mark_gone()

    async def reap(self) -> int:
        """Remove every expired stream now; returns how many were removed."""
        return self._reap()

    async def exists(self, run_id: str) -> bool:
        self._reap()
        return run_id in self._runs

    async def delete(self, run_id: str) -> None:
        if run_id in self._runs:
            self._drop(run_id)

    async def _close(self) -> None:
        for run_id in list(self._runs):
            self._drop(run_id)
        for run in self._waiting.values():
            run.mark_gone()
        self._waiting.clear()
