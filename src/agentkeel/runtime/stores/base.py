"""The two storage interfaces of the control plane.

``RunStore`` holds run and thread records; ``JournalStore`` holds each run's ordered journal.
Each has an in-memory implementation (unit tests, ``memory://``) and one SQL implementation that
runs on SQLite (aiosqlite) and PostgreSQL (psycopg 3). ``tests/runtime/test_store_conformance.py`` holds the one suite
every implementation must pass.

Why admission is a store operation: the guarantee "``reject`` admits at most one active run per
thread" must hold across processes sharing a database, so the check and the insert happen in one
transaction that serialises on the thread (row lock on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite).
The database additionally refuses a second ``running`` run per thread with a partial unique index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from agentkeel.runtime.records import Completion, RunRecord, RunStatus, ThreadRecord


@dataclass(frozen=True)
class AdmitResult:
    record: RunRecord
    # Runs of the thread that were active (pending or running) when this run was admitted,
    # oldest first. The manager displaces them for ``interrupt`` / ``rollback``.
    active_before: list[RunRecord] = field(default_factory=list)


@dataclass(frozen=True)
class StartClaim:
    """A claim offered with an admission: the run starts at once under ``owner``'s lease when it
    is startable as it is admitted (``RunStore.admit``)."""

    owner: str
    lease_expires_at: datetime


class Lease(NamedTuple):
    """One lease to renew: the run, the attempt that holds it, the last stream id it published."""

    run_id: str
    attempt: int
    stream_seq: int = 0


@dataclass(frozen=True)
class JournalEvent:
    run_id: str
    thread_id: str
    seq: int  # run-wide, strictly increasing from 1
    kind: str  # e.g. run.start, model.call, tool.call, stop_reason, file.changed, run.end
    data: dict[str, Any]
    caller: str | None = None  # lead | subagent:<type> | middleware:<name>
    ts: datetime | None = None
    # The rest of the run's coordinate (run_id, attempt, step, seq): the attempt that wrote the
    # event and the root graph's superstep it happened in (None before the graph's first step).
    attempt: int | None = None
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "seq": self.seq,
            "kind": self.kind,
            "caller": self.caller,
            "data": self.data,
            "ts": self.ts.isoformat() if self.ts else None,
            "attempt": self.attempt,
            "step": self.step,
        }


class RunStore(ABC):
    """Runs and threads. Every method is a single atomic operation."""

    async def setup(self) -> None:
        """Create or migrate the schema. Idempotent."""

    async def close(self) -> None:
        """Release connections."""

    # -- admission -------------------------------------------------------------------------
    @abstractmethod
    async def admit(
        self, record: RunRecord, claim: StartClaim | None = None, thread_metadata: Mapping[str, Any] | None = None
    ) -> AdmitResult:
        """Insert ``record`` (status pending) and upsert its thread, atomically.

        With strategy ``reject`` raises ``ConflictError`` if the thread has an active run, and
        writes nothing. Other strategies always insert and report the runs that were active.

        ``claim``: when the run is startable as it is admitted (its thread has no active run and
        it has no ``not_before``), it is stored already claimed -- running, attempt 1, owned by
        ``claim.owner`` under ``claim.lease_expires_at``, its thread ``busy`` -- exactly what
        ``claim_next`` would make of it, in the admission's own transaction. Why: a run admitted
        by a process that executes it starts without a second transaction (on PostgreSQL, five
        more round trips before its first event). Otherwise the run stays pending and ``claim``
        is ignored; the returned record's status says which happened.

        ``thread_metadata``: merged into the thread's metadata (its keys win) by the same
        transaction, so a refused admission stamps nothing and an admitted run needs no second
        write on its way to its first event.
        """

    # -- fenced writes after admission -------------------------------------------------------
    @abstractmethod
    async def mark_running(
        self, run_id: str, attempt: int, owner: str | None, lease_expires_at: datetime | None
    ) -> RunRecord:
        """pending -> running for exactly this attempt.

        Raises ``FencedOut`` if the run is not pending at that attempt, ``ConflictError`` if another
        run of the thread is already running (the database's partial unique index).
        """

    @abstractmethod
    async def finish(
        self, run_id: str, attempt: int, completion: Completion, end: JournalEvent | None = None,
        thread_status: str | None = None,
    ) -> RunRecord:
        """Write the terminal status, stop reasons, usage and error in one fenced write.

        ``end``: the run's ``run.end`` journal event, stored in the same transaction (idempotent on
        its seq), so the journal says the run ended exactly when — and only if — its record does.
        ``thread_status``: the status the run's thread settles in, set in the same transaction
        unless another run of the thread is running already (as ``set_thread_status(...,
        unless_running=True)``): no reader sees the ended run on a thread still ``busy`` with it.

        Only an active run at exactly ``attempt`` is changed; anything else raises ``FencedOut``
        and leaves the stored record untouched (a terminal status is never replaced). While the run
        carries a ``control`` request that the completion does not acknowledge, raises
        ``ControlPending`` (the request was first, so it decides how the run ends).
        """

    @abstractmethod
    async def finish_pending(self, run_id: str, attempt: int, completion: Completion) -> RunRecord:
        """``finish`` for a run that never started: only a *pending* run at ``attempt`` changes.

        Cancelling a queued run races a worker claiming it; once claimed, the run is the owner's
        to end (through its control request), so this write is then fenced out.
        """

    @abstractmethod
    async def update_usage(self, run_id: str, attempt: int, usage: dict[str, Any]) -> bool:
        """Progress write while running; False (no change) when fenced out."""

    # -- ownership: claims, leases, recovery, control -------------------------------------------
    @abstractmethod
    async def claim_next(
        self, owner: str, lease_expires_at: datetime, now: datetime, run_ids: list[str] | None = None
    ) -> RunRecord | None:
        """Start the oldest startable pending run for ``owner``: pending -> running, same attempt.

        ``run_ids`` limits the candidates (a process that executes only the runs it admitted).

        Startable: the head of its thread's queue (per-thread FIFO), its thread has no running run,
        and its ``not_before`` has passed. Exactly one of any number of concurrent claimers (in any
        process) gets a given run (``FOR UPDATE SKIP LOCKED`` on PostgreSQL); None when nothing is
        startable. The claimed run's thread is marked ``busy`` in the same transaction, so no reader
        sees a running run on an ``idle`` thread.
        """

    @abstractmethod
    async def next_start_at(self) -> datetime | None:
        """The earliest ``not_before`` of a pending run still in the future (a claimer's timer)."""

    @abstractmethod
    async def renew_leases(
        self, owner: str, lease_expires_at: datetime, leases: Sequence[Lease]
    ) -> dict[str, RunRecord | None]:
        """Extend ``owner``'s leases of running runs, all in one transaction (one connection, one
        commit: a worker's renewals must not queue behind its runs' own writes, one per run).

        For each run: its record (with any ``control`` request), or None when that attempt no
        longer owns it (superseded, or ended)."""

    @abstractmethod
    async def expired_runs(self, now: datetime, limit: int = 100) -> list[RunRecord]:
        """Running runs whose lease expired before ``now``, oldest lease first."""

    @abstractmethod
    async def claim(
        self, run_id: str, owner: str, lease_expires_at: datetime | None, *, attempt: int | None = None
    ) -> RunRecord:
        """Take ownership of an active run: bump ``attempt``, set owner and lease.

        With ``attempt`` only that attempt is taken over (two recoverers of one expired run: one
        wins, the other is fenced out). After a claim every write naming an older attempt is fenced
        out.
        """

    @abstractmethod
    async def request_control(self, run_id: str, control: dict[str, Any]) -> RunRecord:
        """Store a cancel / interrupt / rollback request on an active run; the first one stands.

        Returns the record with the request that stands (an earlier one is kept). Raises
        ``FencedOut`` when the run already ended (the completion was first).
        """

    # -- reads -------------------------------------------------------------------------------
    @abstractmethod
    async def get(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    async def list_runs(
        self,
        thread_id: str | None = None,
        statuses: list[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        """Newest first."""

    @abstractmethod
    async def count_runs(self, statuses: list[RunStatus]) -> dict[RunStatus, int]:
        """How many runs have each of ``statuses`` (every one present, 0 when none): one indexed
        count for ``/metrics``, meant for the live statuses, whose rows the queue bounds."""

    @abstractmethod
    async def active_runs(self, thread_id: str) -> list[RunRecord]:
        """Pending and running runs of the thread in admission order (oldest first)."""

    @abstractmethod
    async def delete_run(self, run_id: str) -> bool: ...

    # -- threads -----------------------------------------------------------------------------
    @abstractmethod
    async def upsert_thread(self, thread_id: str, metadata: dict[str, Any] | None = None) -> ThreadRecord: ...

    @abstractmethod
    async def create_thread(self, thread_id: str, metadata: dict[str, Any]) -> ThreadRecord | None:
        """Insert a new thread with ``metadata``; None (and nothing changed) if the id exists.

        Unlike ``upsert_thread`` it never merges into a thread someone else made: of concurrent
        creators of one id exactly one gets the record, which is what makes a thread's ``owner``
        metadata trustworthy."""

    @abstractmethod
    async def get_thread(self, thread_id: str) -> ThreadRecord | None: ...

    @abstractmethod
    async def set_thread_status(self, thread_id: str, status: str, *, unless_running: bool = False) -> None:
        """Set the status of an existing thread (a deleted thread stays deleted).

        ``unless_running``: only while none of its runs is running — how a finished run settles its
        thread without overwriting the ``busy`` of the next run another worker already started.
        """

    @abstractmethod
    async def list_threads(self, limit: int = 100, offset: int = 0) -> list[ThreadRecord]: ...

    @abstractmethod
    async def delete_thread(self, thread_id: str) -> bool:
        """Delete the thread and all of its runs."""


class JournalStore(ABC):
    """Ordered journal events per run. ``(run_id, seq)`` is unique; re-appending it is a no-op."""

    async def setup(self) -> None: ...

    async def close(self) -> None: ...

    @abstractmethod
    async def append(self, events: list[JournalEvent]) -> None: ...

    @abstractmethod
    async def list(
        self,
        run_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        kinds: list[str] | None = None,
    ) -> list[JournalEvent]:
        """Events of one run in ``seq`` order."""

    @abstractmethod
    async def delete_run(self, run_id: str) -> None: ...
