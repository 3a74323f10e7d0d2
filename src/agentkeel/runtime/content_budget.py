"""One process-wide byte budget for the run content a worker holds in memory.

Why: every per-run bound multiplies by the runs in flight. Each run's ``EventEncoder`` memo may
hold ``MEMO_MAX_BYTES`` and its "before" workspace snapshot ``snapshot_max_total_bytes`` of file
content, so 64 concurrent runs could hold 64 times both. ``limits.content_max_bytes`` bounds what
all runs of the process hold together; the per-run bounds still apply within it.

Two kinds of holder, with different rights:

* **caches** (encoder memos) are reclaimable. They hold bytes only while nobody needs them more:
  a reservation sheds any of them, and a cache that wants to grow sheds only larger ones, so the
  memos of concurrent runs converge to equal shares; the largest cache goes first, its least
  recently used entries first. Losing a cache entry costs re-encoding, never a different output.
* **reservations** (snapshot content) are not reclaimable: the content is what a rollback puts
  back. A reservation that does not fit even after shedding every cache is refused; the snapshot
  then keeps that file's hash only and a rollback involving it is refused (``unrestorable``),
  which is honest where silently evicting kept content would not be.

Thread safety: snapshots are captured on worker threads while encoders run on the event loop, so
``reserve``, ``release`` and shedding may be called from any thread. The budget's lock is never
held while a cache is asked to shed, and a cache never holds its own lock while it calls the
budget, so the two locks are always taken in one order.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol


class Reclaimable(Protocol):
    """A cache whose bytes the budget may take back."""

    @property
    def held_bytes(self) -> int:
        """Bytes the cache holds now (all of them charged to the budget)."""
        ...

    def shed(self, nbytes: int) -> int:
        """Drop entries, oldest first, until ``nbytes`` are freed or none are left; release them to
        the budget and return how many bytes were freed (more than 0 whenever it held any)."""
        ...


class ContentBudget:
    """Bytes of run content held in memory by this process; ``max_bytes`` ``None`` is unbounded
    (the accounting still runs, so ``held`` and ``peak`` are always true)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.peak = 0
        """The most bytes held at once since the budget was made."""
        self.refused = 0
        """Reservations refused for want of room (snapshot files captured as hashes only)."""
        self._held = 0
        self._lock = threading.Lock()
        self._caches: weakref.WeakSet[Reclaimable] = weakref.WeakSet()

    @property
    def held(self) -> int:
        """Bytes charged now: every cache's entries and every live reservation."""
        return self._held

    def attach(self, cache: Reclaimable) -> None:
        """Let the budget shed ``cache`` when room is needed (weakly held: a cache that is
        garbage-collected unregisters itself, though its owner must still release its bytes)."""
        with self._lock:
            self._caches.add(cache)

    def detach(self, cache: Reclaimable) -> None:
        with self._lock:
            self._caches.discard(cache)

    def reserve(self, nbytes: int, cache: Reclaimable | None = None) -> bool:
        """Charge ``nbytes`` if they fit, shedding caches first when they do not; ``False`` (and
        nothing charged) when even that leaves too little room.

        A reservation (``cache`` ``None``) may shed any cache. A cache growing itself (``cache``:
        the asker) may only shed caches that would still be larger than it: memos converge to
        equal shares instead of taking entries from each other in turn, and one already at its
        share (the budget over the number of caches) is refused at once, without a scan. A refused
        memo keeps what it has, which for a ``values`` stream re-sending its history in order
        keeps hitting, where evicting its oldest entries to admit new ones would miss every time.
        """
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if self._try_charge(nbytes):
            return True
        if cache is None:
            self._make_room(nbytes, above=0)
        else:
            after = cache.held_bytes + nbytes
            with self._lock:
                share = (self.max_bytes or 0) // max(1, len(self._caches))
            if after > share:
                return False
            self._make_room(nbytes, above=after)
        if self._try_charge(nbytes):
            return True
        if cache is None:
            with self._lock:
                self.refused += 1
        return False

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` charged before (a reservation or a cache's entries)."""
        with self._lock:
            if nbytes < 0 or nbytes > self._held:
                raise ValueError(f"releasing {nbytes} bytes of {self._held} held")
            self._held -= nbytes

    def _try_charge(self, nbytes: int) -> bool:
        with self._lock:
            if self.max_bytes is not None and self._held + nbytes > self.max_bytes:
                return False
            self._held += nbytes
            self.peak = max(self.peak, self._held)
            return True

    def _make_room(self, nbytes: int, above: int) -> None:
        """Shed caches holding more than ``above`` bytes, largest first, until ``nbytes`` more
        would fit or no such cache is left."""
        if self.max_bytes is None or nbytes > self.max_bytes:
            return  # unbounded, or could never fit: shedding would only cost re-encoding
        while True:
            with self._lock:
                excess = self._held + nbytes - self.max_bytes
                caches = [cache for cache in self._caches if cache.held_bytes > above]
            if excess <= 0 or not caches:
                return
            largest = max(caches, key=lambda cache: cache.held_bytes)
            if not largest.shed(min(excess, largest.held_bytes - above)):
                return  # emptied meanwhile by its own thread: look again next time


__all__ = ["ContentBudget", "Reclaimable"]
