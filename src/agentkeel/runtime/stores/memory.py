"""In-memory stores: unit tests and ``memory://``.

They keep the SQL stores' semantics exactly (the conformance suite runs against both): every
operation runs under one ``asyncio.Lock`` and checks everything before mutating anything, which is
what a rolled-back transaction gives the SQL stores. Records go in and out as copies whose JSON
fields are round-tripped through ``json`` -- callers cannot reach into stored state, and a payload
the database would refuse (a ``datetime`` in ``kwargs``) fails here too instead of only in
production.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from agentkeel.runtime.records import (
    ACTIVE_STATUSES,
    Completion,
    ConflictError,
    RunRecord,
    RunStatus,
    ThreadRecord,
    utcnow,
)
from agentkeel.runtime.stores.base import AdmitResult, JournalEvent, JournalStore, Lease, RunStore, StartClaim
from agentkeel.runtime.stores.common import (
    admitted_record,
    as_utc,
    check_admissible,
    control_pending,
    fenced_out,
    require_terminal,
    require_thread_status,
    startable,
)

_PENDING = frozenset({RunStatus.pending})
_RUNNING = frozenset({RunStatus.running})


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _copy_run(record: RunRecord) -> RunRecord:
    return replace(
        record,
        lease_expires_at=as_utc(record.lease_expires_at),
        created_at=as_utc(record.created_at),
        updated_at=as_utc(record.updated_at),
        started_at=as_utc(record.started_at),
        ended_at=as_utc(record.ended_at),
        not_before=as_utc(record.not_before),
        control=_json(record.control),
        kwargs=_json(record.kwargs),
        metadata=_json(record.metadata),
        stop_reasons=_json(record.stop_reasons),
        usage=_json(record.usage),
        error_detail=_json(record.error_detail),
    )


def _fenced(current: RunRecord, attempt: int, statuses: frozenset[RunStatus]) -> bool:
    """The memory twin of the SQL stores' ``WHERE attempt = :attempt AND status IN (...)``."""
    return current.attempt != attempt or current.status not in statuses


def _copy_thread(thread: ThreadRecord) -> ThreadRecord:
    return replace(thread, metadata=_json(thread.metadata))


class MemoryJournalStore(JournalStore):
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._events: dict[str, dict[int, JournalEvent]] = {}

    async def append(self, events: list[JournalEvent]) -> None:
        async with self._lock:
            now = utcnow()
            for event in events:
                bucket = self._events.setdefault(event.run_id, {})
                if event.seq not in bucket:  # idempotent: the first write of a seq stands
                    bucket[event.seq] = replace(
                        event, data=_json(event.data), ts=as_utc(event.ts) or now
                    )

    async def list(
        self,
        run_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        kinds: list[str] | None = None,
    ) -> list[JournalEvent]:
        async with self._lock:
            bucket = self._events.get(run_id, {})
            found = [
                replace(bucket[seq], data=_json(bucket[seq].data))
                for seq in sorted(bucket)
                if seq > after_seq and (kinds is None or bucket[seq].kind in kinds)
            ]
        return found if limit is None else found[:limit]

    async def delete_run(self, run_id: str) -> None:
        async with self._lock:
            self._events.pop(run_id, None)

    async def delete_thread(self, thread_id: str) -> None:
        """Drop every event of the thread (the SQL store does this inside ``delete_thread``)."""
        async with self._lock:
            for run_id, bucket in list(self._events.items()):
                for seq in [s for s, e in bucket.items() if e.thread_id == thread_id]:
                    del bucket[seq]
                if not bucket:
                    del self._events[run_id]


class MemoryRunStore(RunStore):
    """Runs and threads in dicts; ``journal`` is the store whose events die with their run."""

    def __init__(self, journal: MemoryJournalStore | None = None) -> None:
        self._lock = asyncio.Lock()
        self._journal = journal or MemoryJournalStore()
        self._runs: dict[str, RunRecord] = {}
        self._queue_seq: dict[str, int] = {}  # run_id -> per-thread admission order
        self._threads: dict[str, ThreadRecord] = {}

    # -- helpers (call with the lock held) ---------------------------------------------------
    def _thread_runs(self, thread_id: str) -> list[RunRecord]:
        runs = [r for r in self._runs.values() if r.thread_id == thread_id]
        return sorted(runs, key=lambda r: self._queue_seq[r.run_id])

    def _active(self, thread_id: str) -> list[RunRecord]:
        return [r for r in self._thread_runs(thread_id) if r.status in ACTIVE_STATUSES]

    def _touch_thread(self, thread_id: str, now: datetime) -> ThreadRecord:
        thread = self._threads.get(thread_id)
        if thread is None:
            thread = self._threads[thread_id] = ThreadRecord(
                thread_id=thread_id, created_at=now, updated_at=now
            )
        thread.updated_at = now
        return thread

    # -- admission ---------------------------------------------------------------------------
    async def admit(
        self, record: RunRecord, claim: StartClaim | None = None, thread_metadata: Mapping[str, Any] | None = None
    ) -> AdmitResult:
        async with self._lock:
            active = self._active(record.thread_id)
            check_admissible(record, active)
            if record.run_id in self._runs:
                raise ValueError(f"run {record.run_id} already exists")
            now = utcnow()
            # Copied before touching anything: the copy validates the JSON.
            stored = _copy_run(admitted_record(record, active, claim, now))
            stamped = _json(dict(thread_metadata or {}))
            seqs = [self._queue_seq[r.run_id] for r in self._thread_runs(record.thread_id)]
            thread = self._touch_thread(record.thread_id, now)
            if stored.status is RunStatus.running:
                thread.status = "busy"
            thread.metadata = {**thread.metadata, **stamped}
            self._runs[record.run_id] = stored
            self._queue_seq[record.run_id] = max(seqs, default=0) + 1
            return AdmitResult(_copy_run(stored), [_copy_run(r) for r in active])

    # -- fenced writes -----------------------------------------------------------------------
    async def mark_running(
        self, run_id: str, attempt: int, owner: str | None, lease_expires_at: datetime | None
    ) -> RunRecord:
        async with self._lock:
            current = self._runs.get(run_id)
            if current is None or _fenced(current, attempt, _PENDING):
                raise fenced_out(run_id, attempt, current)
            if any(r.status is RunStatus.running for r in self._thread_runs(current.thread_id)):
                raise ConflictError(f"thread {current.thread_id} already has a running run")
            now = utcnow()
            current.status = RunStatus.running
            current.owner = owner
            current.lease_expires_at = as_utc(lease_expires_at)
            current.started_at = now
            current.updated_at = now
            return _copy_run(current)

    async def finish(
        self, run_id: str, attempt: int, completion: Completion, end: JournalEvent | None = None,
        thread_status: str | None = None,
    ) -> RunRecord:
        return await self._finish(run_id, attempt, completion, ACTIVE_STATUSES, end, thread_status)

    async def finish_pending(self, run_id: str, attempt: int, completion: Completion) -> RunRecord:
        return await self._finish(run_id, attempt, completion, _PENDING)

    async def _finish(
        self, run_id: str, attempt: int, completion: Completion, statuses: frozenset[RunStatus],
        end: JournalEvent | None = None, thread_status: str | None = None,
    ) -> RunRecord:
        require_terminal(completion.status)
        if thread_status is not None:
            require_thread_status(thread_status)
        async with self._lock:
            current = self._runs.get(run_id)
            if current is None or _fenced(current, attempt, statuses):
                raise fenced_out(run_id, attempt, current)
            if current.control is not None and not completion.acknowledges_control:
                raise control_pending(run_id, current.control)
            stop_reasons, usage = _json(completion.stop_reasons), _json(completion.usage)
            now = utcnow()
            current.status = completion.status
            current.stop_reasons = stop_reasons
            current.usage = usage
            current.error = completion.error
            current.error_detail = _json(completion.error_detail)
            current.ended_at = now
            current.updated_at = now
            current.lease_expires_at = None
            if end is not None:  # under this store's lock: no reader sees one without the other
                await self._journal.append([end])
            if thread_status is not None:
                self._settle_thread(current.thread_id, thread_status, now)
            return _copy_run(current)

    async def update_usage(self, run_id: str, attempt: int, usage: dict[str, Any]) -> bool:
        async with self._lock:
            current = self._runs.get(run_id)
            if current is None or _fenced(current, attempt, ACTIVE_STATUSES):
                return False
            current.usage = _json(usage)
            current.updated_at = utcnow()
            return True

    async def claim_next(
        self, owner: str, lease_expires_at: datetime, now: datetime, run_ids: list[str] | None = None
    ) -> RunRecord | None:
        async with self._lock:
            heads = []
            for thread_id in {r.thread_id for r in self._runs.values() if r.status is RunStatus.pending}:
                active = self._active(thread_id)
                if active and active[0].status is RunStatus.pending and startable(active[0], now) and (
                    run_ids is None or active[0].run_id in run_ids
                ):
                    heads.append(active[0])
            if not heads:
                return None
            run = min(heads, key=lambda r: (r.created_at, self._queue_seq[r.run_id], r.run_id))
            run.status = RunStatus.running
            run.owner = owner
            run.lease_expires_at = as_utc(lease_expires_at)
            run.started_at = run.updated_at = utcnow()
            thread = self._threads.get(run.thread_id)
            if thread is not None:
                thread.status, thread.updated_at = "busy", run.started_at
            return _copy_run(run)

    async def next_start_at(self) -> datetime | None:
        async with self._lock:
            now = utcnow()
            times = [
                r.not_before for r in self._runs.values()
                if r.status is RunStatus.pending and r.not_before is not None and r.not_before > now
            ]
            return min(times, default=None)

    async def renew_leases(
        self, owner: str, lease_expires_at: datetime, leases: Sequence[Lease]
    ) -> dict[str, RunRecord | None]:
        async with self._lock:
            renewed: dict[str, RunRecord | None] = {}
            for lease in leases:
                current = self._runs.get(lease.run_id)
                if current is None or _fenced(current, lease.attempt, _RUNNING) or current.owner != owner:
                    renewed[lease.run_id] = None
                    continue
                current.lease_expires_at = as_utc(lease_expires_at)
                current.stream_seq = max(current.stream_seq, lease.stream_seq)
                current.updated_at = utcnow()
                renewed[lease.run_id] = _copy_run(current)
            return renewed

    async def expired_runs(self, now: datetime, limit: int = 100) -> list[RunRecord]:
        async with self._lock:
            expired = [
                r for r in self._runs.values()
                if r.status is RunStatus.running and r.lease_expires_at is not None
                and r.lease_expires_at < now
            ]
            expired.sort(key=lambda r: (r.lease_expires_at, r.run_id))
            return [_copy_run(r) for r in expired[:limit]]

    async def claim(
        self, run_id: str, owner: str, lease_expires_at: datetime | None, *, attempt: int | None = None
    ) -> RunRecord:
        async with self._lock:
            current = self._runs.get(run_id)
            if current is None or current.status not in ACTIVE_STATUSES or (
                attempt is not None and current.attempt != attempt
            ):
                raise fenced_out(run_id, attempt, current)
            current.attempt += 1
            current.owner = owner
            current.lease_expires_at = as_utc(lease_expires_at)
            current.updated_at = utcnow()
            return _copy_run(current)

    async def request_control(self, run_id: str, control: dict[str, Any]) -> RunRecord:
        async with self._lock:
            current = self._runs.get(run_id)
            if current is None or current.status not in ACTIVE_STATUSES:
                raise fenced_out(run_id, None, current)
            if current.control is None:
                current.control = _json(control)
                current.updated_at = utcnow()
            return _copy_run(current)

    # -- reads -------------------------------------------------------------------------------
    async def get(self, run_id: str) -> RunRecord | None:
        async with self._lock:
            current = self._runs.get(run_id)
            return _copy_run(current) if current else None

    async def list_runs(
        self,
        thread_id: str | None = None,
        statuses: list[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        async with self._lock:
            runs = [
                r
                for r in self._runs.values()
                if (thread_id is None or r.thread_id == thread_id)
                and (statuses is None or r.status in statuses)
            ]
            runs.sort(
                key=lambda r: (r.created_at, self._queue_seq[r.run_id], r.run_id), reverse=True
            )
            return [_copy_run(r) for r in runs[offset : offset + limit]]

    async def count_runs(self, statuses: list[RunStatus]) -> dict[RunStatus, int]:
        async with self._lock:
            found = [r.status for r in self._runs.values()]
        return {s: found.count(s) for s in statuses}

    async def active_runs(self, thread_id: str) -> list[RunRecord]:
        async with self._lock:
            return [_copy_run(r) for r in self._active(thread_id)]

    async def delete_run(self, run_id: str) -> bool:
        async with self._lock:
            found = self._runs.pop(run_id, None) is not None
            self._queue_seq.pop(run_id, None)
            await self._journal.delete_run(run_id)
            return found

    # -- threads -----------------------------------------------------------------------------
    async def upsert_thread(
        self, thread_id: str, metadata: dict[str, Any] | None = None
    ) -> ThreadRecord:
        async with self._lock:
            merged = {**self._threads[thread_id].metadata} if thread_id in self._threads else {}
            merged.update(_json(metadata or {}))
            thread = self._touch_thread(thread_id, utcnow())
            thread.metadata = merged
            return _copy_thread(thread)

    async def create_thread(self, thread_id: str, metadata: dict[str, Any]) -> ThreadRecord | None:
        async with self._lock:
            if thread_id in self._threads:
                return None
            stored = _json(metadata)  # before touching anything: it validates the JSON
            thread = self._touch_thread(thread_id, utcnow())
            thread.metadata = stored
            return _copy_thread(thread)

    async def get_thread(self, thread_id: str) -> ThreadRecord | None:
        async with self._lock:
            thread = self._threads.get(thread_id)
            return _copy_thread(thread) if thread else None

    async def set_thread_status(self, thread_id: str, status: str, *, unless_running: bool = False) -> None:
        require_thread_status(status)
        async with self._lock:
            if unless_running:
                self._settle_thread(thread_id, status, utcnow())
            elif (thread := self._threads.get(thread_id)) is not None:
                thread.status, thread.updated_at = status, utcnow()

    def _settle_thread(self, thread_id: str, status: str, now: datetime) -> None:
        """Set an existing thread's status unless one of its runs is running (under the lock)."""
        thread = self._threads.get(thread_id)
        if thread is not None and not any(r.status is RunStatus.running for r in self._thread_runs(thread_id)):
            thread.status, thread.updated_at = status, now

    async def list_threads(self, limit: int = 100, offset: int = 0) -> list[ThreadRecord]:
        async with self._lock:
            threads = sorted(
                self._threads.values(), key=lambda t: (t.created_at, t.thread_id), reverse=True
            )
            return [_copy_thread(t) for t in threads[offset : offset + limit]]

    async def delete_thread(self, thread_id: str) -> bool:
        async with self._lock:
            found = self._threads.pop(thread_id, None) is not None
            for run in self._thread_runs(thread_id):
                del self._runs[run.run_id]
                del self._queue_seq[run.run_id]
            await self._journal.delete_thread(thread_id)
            return found
