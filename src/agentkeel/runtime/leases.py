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
from datetime import timedelta

from agentkeel.runtime.active import AbortRequest, ActiveRun
from agentkeel.runtime.records import RunStatus, utcnow
from agentkeel.runtime.stores.base import RunStore

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

    def expiry(self):  # noqa: ANN201 - a datetime; kept short for the call sites
        return utcnow() + timedelta(seconds=self.ttl_s)

    def start_lease(self, active: ActiveRun, sent_at: float) -> None:
        """Record the lease a claim just took (``sent_at``: monotonic time the claim was sent)."""
        active.lease_deadline = sent_at + self.ttl_s - self.margin_s

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.renew_all()

    async def renew_all(self) -> None:
        owned = [a for a in self._runs.values() if not a.fenced and a.record.status is RunStatus.running]
        if owned:
            await asyncio.gather(*(self.renew(active) for active in owned))

    async def renew(self, active: ActiveRun) -> None:
        record = active.record
        sent = time.monotonic()
        remaining = active.lease_deadline - sent
        if remaining <= 0:
            self._lose(active, "its lease could not be confirmed before the deadline")
            return
        try:
            async with asyncio.timeout(remaining):
                renewed = await self._store.renew_lease(
                    record.run_id, record.attempt, self._owner, self.expiry(),
                    self._last_stream_seq(record.run_id) or 0,
                )
        except Exception as exc:  # unreachable store, or the deadline passed while waiting
            if time.monotonic() >= active.lease_deadline:
                self._lose(active, f"its lease could not be confirmed before the deadline ({exc!r})")
            else:
                log.warning("run %s: lease renewal failed, retrying: %r", record.run_id, exc)
            return
        if renewed is None:
            current = await self._store.get(record.run_id)
            if current is not None and current.attempt == record.attempt and current.status.terminal:
                return  # our own completion landed while the renewal was in flight
            self._lose(active, "another attempt owns the run, or it ended elsewhere")
            return
        active.lease_deadline = sent + self.ttl_s - self.margin_s
        if renewed.control is not None:
            apply_control(active, renewed.control)

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
