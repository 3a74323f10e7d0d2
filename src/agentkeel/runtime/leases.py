"""Keeping the runs this process owns: lease renewal, self-fencing, stored control requests.

The owner of a running run renews its lease every third of ``limits.lease_ttl_s``. Each renewal
is one fenced write naming the run's attempt and owner, and it answers two questions at once: do
we still own the run, and has anyone stored a control request (cancel, interrupt, rollback) for it?

Why self-fencing: a worker that cannot confirm its lease (the database is unreachable, or another
worker took the run over after our lease expired) must assume someone else is running the run. It
stops the run and writes nothing more — no completion, no thread status, no END — so the new owner's
result is never overwritten and observers are never told "done" by a process that no longer knows.
The deadline is kept on the monotonic clock from the moment each renewal was *sent*, so a slow
reply never extends it, and the run stops a margin before the stored expiry other workers act on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from agentkeel.runtime.active import AbortRequest, ActiveRun
from agentkeel.runtime.records import RunStatus, utcnow
from agentkeel.runtime.stores.base import Lease, RunStore

log = logging.getLogger(__name__)

LastSeq = Callable[[str], int | None]


class LeaseKeeper:
    def __init__(
        self,
        store: RunStore,
        owner: str,
        ttl_s: float,
        runs: Mapping[str, ActiveRun],
        last_stream_seq: LastSeq,
    ) -> None:
        self._store = store
        self._owner = owner
        self.ttl_s = ttl_s
        self._runs = runs
        self._last_stream_seq = last_stream_seq
        # Stop this long before the stored expiry: clocks of other hosts and the time our own
        # finalization needs to stop writing.
        self.margin_s = max(ttl_s / 10, 0.5)

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 3

    def expiry(self) -> datetime:
        """The expiry a lease taken or renewed now is stored with."""
        return utcnow() + timedelta(seconds=self.ttl_s)

    def start_lease(self, active: ActiveRun, sent_at: float) -> None:
        """Record the lease a claim just took (``sent_at``: monotonic time the claim was sent)."""
        active.lease_deadline = sent_at + self.ttl_s - self.margin_s

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.renew_all()
            except Exception:  # the loop must outlive any one failure: deadlines are checked here
                log.exception("renewing leases failed; retrying at the next interval")

    async def renew_all(self) -> None:
        """Renew every lease this process holds, in one store transaction."""
        owned = [a for a in self._runs.values() if not a.fenced and a.record.status is RunStatus.running]
        if owned:
            await self.renew(*owned)

    async def renew(self, *owned: ActiveRun) -> None:
        sent = time.monotonic()
        for active in [a for a in owned if a.lease_deadline <= sent]:
            self._lose(active, "its lease could not be confirmed before the deadline")
        owned = tuple(a for a in owned if not a.fenced)
        if not owned:
            return
        leases = [
            Lease(a.record.run_id, a.record.attempt, self._last_stream_seq(a.record.run_id) or 0)
            for a in owned
        ]
        try:
            async with asyncio.timeout(min(a.lease_deadline for a in owned) - sent):
                renewed = await self._store.renew_leases(self._owner, self.expiry(), leases)
        except Exception as exc:  # unreachable store, or the earliest deadline passed while waiting
            now = time.monotonic()
            for active in owned:
                if now >= active.lease_deadline:
                    self._lose(active, f"its lease could not be confirmed before the deadline ({exc!r})")
            log.warning("lease renewal of %d run(s) failed, retrying: %r", len(owned), exc)
            return
        for active in owned:
            record = renewed.get(active.record.run_id)
            if record is None:
                await self._not_renewed(active)
                continue
            active.lease_deadline = sent + self.ttl_s - self.margin_s
            if record.control is not None:
                apply_control(active, record.control)

    async def _not_renewed(self, active: ActiveRun) -> None:
        current = await self._store.get(active.record.run_id)
        if current is not None and current.attempt == active.record.attempt and current.status.terminal:
            return  # our own completion landed while the renewal was in flight
        self._lose(active, "another attempt owns the run, or it ended elsewhere")

    def _lose(self, active: ActiveRun, why: str) -> None:
        if active.fenced:
            return
        log.error("run %s attempt %s: lease lost, stopping and writing nothing more: %s",
                  active.record.run_id, active.record.attempt, why)
        active.fenced = True
        if active.journal is not None:
            active.journal.fence()  # refuses tool intents at once: no new non-idempotent call starts
        active.request_abort(AbortRequest("interrupt", "lease_lost", "worker", f"lease lost: {why}"))


def apply_control(active: ActiveRun, control: dict[str, object]) -> None:
    """Carry out a stored control request on a run this process executes (first one wins)."""
    active.request_abort(AbortRequest.from_stored(dict(control)))


__all__ = ["LeaseKeeper", "apply_control"]
