"""How many subagents one process runs at once; the rest wait their turn, first come first served.

Why a queue and not a refusal: DeerFlow's fixed pool of three made a batch of six impossible to
run well (the fourth waited while its caller's poll budget ran out), and a refusal would turn load
into failed delegations. Why FIFO by construction rather than ``asyncio.Semaphore``: the order in
which waiting subagents start is a promise here (a subagent queued first starts first), so it is
a deque of futures that a test can check, not an implementation detail of the event loop.

A waiting subagent's own clock has not started: its timeout counts from :meth:`slot`'s entry.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Capacity:
    """``limit`` slots, granted in request order. Cancelling a waiter gives up its place."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("capacity must be at least 1")
        self.limit = limit
        self._running = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiting if not f.done())

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot for the body; wait (FIFO) while all are taken."""
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self._running < self.limit and not self.waiting:
            self._running += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await future  # _release hands its slot over: _running already counts this waiter
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # granted just as it was cancelled: pass the slot on
            raise

    def _release(self) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)  # the slot goes to the longest waiter, still counted
                return
        self._running -= 1


__all__ = ["Capacity"]
