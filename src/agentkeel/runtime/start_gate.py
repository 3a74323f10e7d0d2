"""Starting runs go first: the runs already streaming step aside while a run is being started.

Why: one event loop executes every run of a process. A run that is streaming is a chain of CPU
bursts (a model turn, a checkpoint, encoding a ``values`` chunk), and asyncio hands out turns in
FIFO order, so each await of a run being admitted waits behind one burst of *every* running run.
Admission, the claim, building the graph and the first checkpoint are a few dozen awaits: under
ten busy runs the new run's first event came 12x later than on an idle server, although the work
it needed was a few milliseconds. Throughput is not the problem; the order is.

How: while anything holds the gate (a run between its admission and its first published chunk),
a run that has already started waits at its next chunk boundary until the gate is clear, for at
most ``max_pause_s`` per chunk, so a stream of new runs can delay running ones but never stall
them. A hold also lapses by itself after ``max_hold_s``: a run whose first chunk is a real
model's first token may wait seconds for it, and the others must not crawl meanwhile. Holds are
counted and released exactly once (a release handle, idempotent); the claimer releases a run's
hold when its task ends, however it ended. The gate is per process: a gateway that only admits
holds it for the admission, the worker process for the start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

MAX_PAUSE_S = 0.25  # longest a running run waits at one chunk boundary
MAX_HOLD_S = 1.0  # longest one start is given priority
START_SLOTS = 2  # runs admitted and started at once; the others queue, in order


class StartGate:
    """Counts starts in progress; running runs ``step_aside`` while there are any."""

    def __init__(
        self, max_pause_s: float | None = None, max_hold_s: float | None = None, slots: int | None = None
    ) -> None:
        self._holders = 0
        self._slots = asyncio.Semaphore(START_SLOTS if slots is None else slots)
        self._clear = asyncio.Event()
        self._clear.set()
        self._max_pause_s = MAX_PAUSE_S if max_pause_s is None else max_pause_s
        self._max_hold_s = MAX_HOLD_S if max_hold_s is None else max_hold_s

    @property
    def holders(self) -> int:
        """Starts in progress now."""
        return self._holders

    @property
    def free_slots(self) -> int:
        """Start slots no run holds now."""
        return self._slots._value  # asyncio.Semaphore keeps its count there; nothing else tells

    def hold(self, max_s: float | None = None) -> Callable[[], None]:
        """Mark a start in progress; call the returned handle (once or more) when it is over. It
        lapses by itself after ``max_s`` (default ``max_hold_s``). Must be called on the event
        loop's thread."""
        self._holders += 1
        self._clear.clear()
        return _once_or_after(self._unhold, self._max_hold_s if max_s is None else max_s)

    def _unhold(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._clear.set()

    async def start(self) -> Callable[[], None]:
        """Hold the gate for a run being admitted and started, and wait for one of the start slots.

        Why slots: ten runs admitted together all hold the gate, so nothing tells them apart and
        they interleave, each await behind the other nine: every one of them is ready only when
        all are, about ten starts' worth of work later. Taking the starts a couple at a time, in
        order of arrival, makes the first ready after one start's work and the median after half
        of them, for the same total (two slots, not one: a start that waits on a database round
        trip leaves the loop to the other). The slot is given back with the hold, by the same
        handle, and lapses with it after ``max_hold_s``.
        """
        release_hold = self.hold()
        try:
            async with asyncio.timeout(self._max_hold_s):
                await self._slots.acquire()
        except TimeoutError:  # the slots' holders are slow: go ahead rather than wait on
            return release_hold
        except BaseException:
            release_hold()
            raise
        release_slot = _once_or_after(self._slots.release, self._max_hold_s)

        def release() -> None:
            release_slot()
            release_hold()

        return release

    async def step_aside(self) -> None:
        """Wait (at most ``max_pause_s``) while starts are in progress; returns at once otherwise,
        without yielding to the loop."""
        if self._holders == 0:
            return
        try:
            async with asyncio.timeout(self._max_pause_s):
                await self._clear.wait()
        except TimeoutError:
            pass


def _once_or_after(action: Callable[[], None], after_s: float) -> Callable[[], None]:
    """A handle that runs ``action`` exactly once: when first called, or after ``after_s`` if it
    has not been called by then (a hold or a slot nobody gave back still ends)."""
    done = False

    def run() -> None:
        nonlocal done
        if done:
            return
        done = True
        lapse.cancel()
        action()

    lapse = asyncio.get_running_loop().call_later(after_s, run)
    return run


__all__ = ["MAX_HOLD_S", "MAX_PAUSE_S", "START_SLOTS", "StartGate"]
