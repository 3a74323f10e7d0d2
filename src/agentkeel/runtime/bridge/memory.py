"""In-process stream bridge: the embedded default and the unit-test backend.

Each run keeps a ``deque(maxlen=retention)`` of events (trimming is the deque's own eviction) and
an ``asyncio.Event`` that is set and replaced on every change, so waiting subscribers wake on
publish instead of polling, and a subscriber that grabbed the event before checking the state
cannot miss a wake-up (there is no ``await`` between the check and the grab).

Memory is bounded in bytes, not only in events: each event is held as the JSON bytes it was
published as (``entry_size``: plus its name, coordinate and a fixed overhead), a run holds at most
``run_max_bytes`` and the process at most ``max_bytes``. Over a budget, the oldest history goes
first: a finished stream whole (its joins are then answered from the run record), else the oldest
events of the least recently written stream. Every stream keeps its newest event, and a subscriber
that had not read what was dropped gets a ``gap``, so nothing is lost silently.

Expiry is lazy and cheap: a stream expires ``ttl_s`` after its last write, or ``end_grace_s``
after its END. Live streams sit in an ``OrderedDict`` ordered by last write and ended ones in a
second one ordered by END, so the reaper only ever looks at the two fronts. It runs on publish,
subscribe, ``exists``, an idle subscriber's heartbeat and ``reap()``. A dropped stream leaves its
last seq behind (a few bytes, the most recent :data:`FINALS_KEPT` runs), so a late observer is told
exactly how many events it missed.

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
    ThreadWatch,
    data_event,
    entry_size,
)

FINALS_KEPT = 10_000
"""Dropped streams whose last seq is remembered (for the ``gap`` of a late observer)."""


@dataclass(eq=False)
class _Run:
    events: deque[StreamEvent]
    seq: int = 0
    ended: bool = False
    gone: bool = False
    touched: float = 0.0
    subscribers: int = 0
    nbytes: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def mark_gone(self) -> None:
        self.gone = True
        self.notify()

    def trim_one(self) -> int:
        """Drop the oldest event (never the newest); the bytes freed."""
        if len(self.events) <= 1:
            return 0
        freed = _size(self.events.popleft())
        self.nbytes -= freed
        return freed

    def batch_after(self, after: int) -> Batch:
        if self.gone:
            raise StreamGone("the stream was deleted or expired")
        start = max(0, after + 1 - self.events[0].seq) if self.events else 0
        items = list(islice(self.events, start, start + READ_BATCH))
        return Batch(items, self.ended and start + len(items) >= len(self.events), self.seq)


def _size(item: StreamEvent) -> int:
    return entry_size(item.event, item.raw, item.at)


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


class _MemoryWatch(ThreadWatch):
    def __init__(self) -> None:
        self.woken = asyncio.Event()

    async def wait(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self.woken.wait()
        except TimeoutError:
            return False
        self.woken.clear()
        return True


class MemoryStreamBridge(StreamBridge):
    cross_process = False

    def __init__(
        self, *, retention: int, ttl_s: float, heartbeat_s: float, max_subscribers: int | None = None,
        end_grace_s: float | None = None, run_max_bytes: int | None = None, max_bytes: int | None = None,
    ) -> None:
        super().__init__(
            retention=retention, ttl_s=ttl_s, heartbeat_s=heartbeat_s, max_subscribers=max_subscribers,
            end_grace_s=end_grace_s,
        )
        if (run_max_bytes is not None and run_max_bytes < 1) or (max_bytes is not None and max_bytes < 1):
            raise ValueError("run_max_bytes and max_bytes must be positive")
        self.run_max_bytes = run_max_bytes
        self.max_bytes = max_bytes
        self.nbytes = 0
        """Bytes the retained events of every stream count for now."""
        self._runs: OrderedDict[str, _Run] = OrderedDict()  # live streams, oldest write first
        self._ended: OrderedDict[str, _Run] = OrderedDict()  # ended streams, oldest END first
        self._waiting: dict[str, _Run] = {}  # placeholders of unwritten runs with subscribers
        self._finals: OrderedDict[str, int] = OrderedDict()  # dropped run -> its last seq
        self._watches: dict[str, set[_MemoryWatch]] = {}

    async def _append(self, run_id: str, event: str, payload: bytes, floor: int, at: bytes = b"") -> StreamEvent:
        run = self._writable(run_id)
        if run.ended:
            raise StreamClosed(f"stream {run_id!r} has ended")
        item = data_event(max(run.seq, floor) + 1, event, payload, at)
        run.seq = item.seq
        if len(run.events) == run.events.maxlen:
            self._account(run, -_size(run.events[0]))  # the deque evicts it on append
        run.events.append(item)
        self._account(run, _size(item))
        self._touch(run_id, run)
        self._enforce(run)
        return item

    async def _append_end(self, run_id: str, floor: int) -> None:
        run = self._writable(run_id)
        if not run.ended:
            run.seq = max(run.seq, floor)
            run.ended = True
            run.touched = time.monotonic()
            self._runs.pop(run_id, None)
            self._ended[run_id] = run
            run.notify()

    def _writable(self, run_id: str) -> _Run:
        self._reap()
        return (self._runs.get(run_id) or self._ended.get(run_id) or self._waiting.pop(run_id, None)
                or self._new_run())

    def _new_run(self) -> _Run:
        return _Run(deque(maxlen=self.retention))

    def _touch(self, run_id: str, run: _Run) -> None:
        run.touched = time.monotonic()
        self._runs[run_id] = run
        self._runs.move_to_end(run_id)
        run.notify()

    def _account(self, run: _Run, delta: int) -> None:
        run.nbytes += delta
        self.nbytes += delta

    def _enforce(self, run: _Run) -> None:
        """Bring ``run`` and then the process back within their byte budgets, oldest first."""
        if self.run_max_bytes is not None:
            while run.nbytes > self.run_max_bytes and (freed := run.trim_one()):
                self.nbytes -= freed
        if self.max_bytes is None or self.nbytes <= self.max_bytes:
            return
        while self._ended and self.nbytes > self.max_bytes:
            self._drop(next(iter(self._ended)))
        for other in list(self._runs.values()):
            while self.nbytes > self.max_bytes and (freed := other.trim_one()):
                self.nbytes -= freed
            if self.nbytes <= self.max_bytes:
                return

    @asynccontextmanager
    async def _reader(self, run_id: str) -> AsyncIterator[Reader]:
        self._reap()
        run = self._runs.get(run_id) or self._ended.get(run_id)
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
        now = time.monotonic()
        removed = 0
        for streams, keep_s in ((self._runs, self.ttl_s), (self._ended, self.end_grace_s)):
            while streams:
                run_id, run = next(iter(streams.items()))
                if run.touched > now - keep_s:
                    break
                self._drop(run_id)
                removed += 1
        return removed

    def _drop(self, run_id: str) -> None:
        run = self._runs.pop(run_id, None) or self._ended.pop(run_id)
        self.nbytes -= run.nbytes
        if run.ended:
            self._finals[run_id] = run.seq
            if len(self._finals) > FINALS_KEPT:
                self._finals.popitem(last=False)
        run.mark_gone()

    async def reap(self) -> int:
        """Remove every expired stream now; returns how many were removed."""
        return self._reap()

    async def final_seq(self, run_id: str) -> int | None:
        return self._finals.get(run_id)

    async def retained_bytes(self, run_id: str) -> int:
        run = self._runs.get(run_id) or self._ended.get(run_id)
        return 0 if run is None else run.nbytes

    async def exists(self, run_id: str) -> bool:
        self._reap()
        return run_id in self._runs or run_id in self._ended

    async def delete(self, run_id: str) -> None:
        if run_id in self._runs or run_id in self._ended:
            self._drop(run_id)
        self._finals.pop(run_id, None)  # deleted, not reaped: nothing about it is kept

    @asynccontextmanager
    async def watch_thread(self, thread_id: str) -> AsyncIterator[ThreadWatch]:
        watch = _MemoryWatch()
        self._watches.setdefault(thread_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches[thread_id]
            watches.discard(watch)
            if not watches:
                del self._watches[thread_id]

    async def _announce(self, thread_id: str) -> None:
        for watch in self._watches.get(thread_id, ()):
            watch.woken.set()

    async def _close(self) -> None:
        for run_id in [*self._runs, *self._ended]:
            self._drop(run_id)
        for run in self._waiting.values():
            run.mark_gone()
        self._waiting.clear()
