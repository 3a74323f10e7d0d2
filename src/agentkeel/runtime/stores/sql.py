"""The SQL run store: one implementation for SQLite and PostgreSQL.

Every write after admission is a single conditional ``UPDATE`` whose ``WHERE`` names the attempt and
the statuses it may change, so the check and the write cannot be separated by another process.
Only when it matches nothing is the row read again, to say *why* the writer was fenced out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Executable, Update, delete, func, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentkeel.runtime.records import (
    Completion,
    ConflictError,
    FencedOut,
    MultitaskStrategy,
    OnDisconnect,
    RunRecord,
    RunStatus,
    ThreadRecord,
    utcnow,
)
from agentkeel.runtime.stores.base import AdmitResult, JournalEvent, Lease, RunStore, StartClaim
from agentkeel.runtime.stores.common import (
    ACTIVE_VALUES,
    admitted_record,
    as_utc,
    check_admissible,
    control_pending,
    fenced_out,
    require_terminal,
    require_thread_status,
)
from agentkeel.runtime.stores.sql_engine import SqlBacked, SqlDatabase, is_unique_violation
from agentkeel.runtime.stores.sql_journal import event_row
from agentkeel.runtime.stores.sql_schema import journal, runs, threads
from agentkeel.runtime.stores.sql_statements import (
    ACTIVE,
    CLAIM,
    CLAIM_AMONG,
    CLAIM_ANY,
    INSERT_RUN,
    RUN,
    RUN_COLUMNS,
    THREAD,
    UPDATE_THREAD,
    UPDATE_THREAD_RETURNING,
    UPDATE_THREAD_UNLESS_RUNNING,
    finish,
)


def _to_run(row: RowMapping) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        thread_id=row["thread_id"],
        assistant_id=row["assistant_id"],
        status=RunStatus(row["status"]),
        attempt=row["attempt"],
        owner=row["owner"],
        lease_expires_at=row["lease_expires_at"],
        multitask_strategy=MultitaskStrategy(row["multitask_strategy"]),
        on_disconnect=OnDisconnect(row["on_disconnect"]),
        kwargs=row["kwargs"],
        metadata=row["metadata"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        stop_reasons=row["stop_reasons"],
        usage=row["usage"],
        error=row["error"],
        error_detail=row["error_detail"],
        not_before=row["not_before"],
        control=row["control"],
        stream_seq=row["stream_seq"],
    )


def _run_values(record: RunRecord) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "thread_id": record.thread_id,
        "assistant_id": record.assistant_id,
        "status": record.status.value,
        "attempt": record.attempt,
        "owner": record.owner,
        "lease_expires_at": record.lease_expires_at,
        "multitask_strategy": record.multitask_strategy.value,
        "on_disconnect": record.on_disconnect.value,
        "kwargs": record.kwargs,
        "metadata": record.metadata,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
        "stop_reasons": record.stop_reasons,
        "usage": record.usage,
        "error": record.error,
        "error_detail": record.error_detail,
        "not_before": record.not_before,
        "control": record.control,
        "stream_seq": record.stream_seq,
    }


def _to_thread(row: RowMapping) -> ThreadRecord:
    return ThreadRecord(
        thread_id=row["thread_id"],
        status=row["status"],
        metadata=row["metadata"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


async def _one(conn: AsyncConnection, statement: Executable, params: dict[str, Any] | None = None) -> RowMapping | None:
    return (await conn.execute(statement, params)).mappings().first()


def _fenced_update(run_id: str, attempt: int | None, *statuses: str) -> Update:
    """``UPDATE runs`` limited to this attempt of the run (any, for None) while it is in one of
    ``statuses``."""
    statement = update(runs).where(runs.c.run_id == run_id, runs.c.status.in_(statuses))
    return statement if attempt is None else statement.where(runs.c.attempt == attempt)


class SqlRunStore(SqlBacked, RunStore):
    def __init__(self, db: SqlDatabase) -> None:
        super().__init__(db)
        self._create_thread = db.insert_ignoring(threads, "thread_id").returning(threads)
        self._touch_thread = db.insert_touching(threads, ("thread_id",), ("updated_at",))

    async def _lock_thread(
        self, conn: AsyncConnection, thread_id: str, now: datetime
    ) -> RowMapping:
        """Create the thread if missing, touch its ``updated_at``, and hold its row until the
        transaction ends: one statement.

        This is what serialises admissions of one thread across processes on PostgreSQL (the
        conflict's update locks the row); on SQLite ``BEGIN IMMEDIATE`` already did.
        """
        row = await _one(
            conn, self._touch_thread,
            {"thread_id": thread_id, "status": "idle", "metadata": {}, "created_at": now, "updated_at": now},
        )
        assert row is not None  # inserted or updated, and returned
        return row

    async def _fenced(self, run_id: str, attempt: int | None, statement: Update) -> RunRecord:
        """Run one conditional ``UPDATE``; if it matched nothing, say why and change nothing."""

        async def work(conn: AsyncConnection) -> RunRecord:
            row = await _one(conn, statement.returning(*RUN_COLUMNS))
            if row is None:
                current = await _one(conn, RUN, {"run_id": run_id})
                raise fenced_out(run_id, attempt, _to_run(current) if current else None)
            return _to_run(row)

        return await self._db.transaction(work)

    # -- admission ---------------------------------------------------------------------------
    async def admit(
        self, record: RunRecord, claim: StartClaim | None = None, thread_metadata: Mapping[str, Any] | None = None
    ) -> AdmitResult:
        async def work(conn: AsyncConnection) -> AdmitResult:
            now = utcnow()
            current = await self._lock_thread(conn, record.thread_id, now)
            thread = {"thread_id": record.thread_id}
            active = [_to_run(r) for r in (await conn.execute(ACTIVE, thread)).mappings()]
            check_admissible(record, active)
            stored = admitted_record(record, active, claim, now)
            try:  # its place in the thread's queue is taken by the INSERT itself (INSERT_RUN)
                row = await _one(conn, INSERT_RUN, {**_run_values(stored), "b_thread_id": record.thread_id})
            except IntegrityError as exc:
                # The thread is locked, so queue_seq is free: only the primary key can clash.
                if is_unique_violation(exc):
                    raise ValueError(f"run {record.run_id} already exists") from exc
                raise
            assert row is not None
            changes: dict[str, Any] = {}
            if stored.status is RunStatus.running:  # claimed as admitted: the thread is busy from here
                changes["status"] = "busy"
            merged = {**current["metadata"], **(thread_metadata or {})}
            if merged != current["metadata"]:
                changes["metadata"] = merged
            if changes:  # one statement for both
                await conn.execute(UPDATE_THREAD, {"b_thread_id": record.thread_id, "updated_at": now, **changes})
            return AdmitResult(_to_run(row), active)

        return await self._db.transaction(work)

    # -- fenced writes -----------------------------------------------------------------------
    async def mark_running(
        self, run_id: str, attempt: int, owner: str | None, lease_expires_at: datetime | None
    ) -> RunRecord:
        now = utcnow()
        statement = _fenced_update(run_id, attempt, RunStatus.pending.value).values(
            status=RunStatus.running.value,
            owner=owner,
            lease_expires_at=lease_expires_at,
            started_at=now,
            updated_at=now,
        )
        try:
            return await self._fenced(run_id, attempt, statement)
        except IntegrityError as exc:
            if is_unique_violation(exc):  # uq_runs_thread_running
                raise ConflictError(
                    f"run {run_id} cannot start: another run of its thread is running"
                ) from exc
            raise

    async def finish(
        self, run_id: str, attempt: int, completion: Completion, end: JournalEvent | None = None,
        thread_status: str | None = None,
    ) -> RunRecord:
        return await self._finish(run_id, attempt, completion, ACTIVE_VALUES, end, thread_status)

    async def finish_pending(self, run_id: str, attempt: int, completion: Completion) -> RunRecord:
        return await self._finish(run_id, attempt, completion, (RunStatus.pending.value,))

    async def _finish(
        self, run_id: str, attempt: int, completion: Completion, statuses: tuple[str, ...],
        end: JournalEvent | None = None, thread_status: str | None = None,
    ) -> RunRecord:
        require_terminal(completion.status)
        if thread_status is not None:
            require_thread_status(thread_status)
        now = utcnow()
        # First action wins: a stored control request outranks a completion that ignores it.
        statement = finish(statuses, unless_control=not completion.acknowledges_control)
        params = {
            "b_run_id": run_id, "b_attempt": attempt, "status": completion.status.value,
            "stop_reasons": completion.stop_reasons, "usage": completion.usage, "error": completion.error,
            "error_detail": completion.error_detail, "ended_at": now, "updated_at": now, "lease_expires_at": None,
        }

        async def work(conn: AsyncConnection) -> RunRecord:
            row = await _one(conn, statement, params)
            if row is None:
                found = await _one(conn, RUN, {"run_id": run_id})
                current = _to_run(found) if found else None
                if (
                    current is not None and current.control is not None
                    and current.attempt == attempt and current.status.value in statuses
                ):
                    raise control_pending(run_id, current.control)
                raise fenced_out(run_id, attempt, current)
            if end is not None:
                await conn.execute(self._db.insert_ignoring(journal, "run_id", "seq"), event_row(end, now))
            if thread_status is not None:  # after the run's own end: only another run keeps it busy
                await conn.execute(UPDATE_THREAD_UNLESS_RUNNING, {
                    "b_thread_id": row["thread_id"], "status": thread_status, "updated_at": now,
                })
            return _to_run(row)

        return await self._db.transaction(work)

    async def update_usage(self, run_id: str, attempt: int, usage: dict[str, Any]) -> bool:
        statement = _fenced_update(run_id, attempt, *ACTIVE_VALUES).values(
            usage=usage, updated_at=utcnow()
        )
        return await self._db.write(statement) > 0

    # -- ownership ---------------------------------------------------------------------------
    async def claim_next(
        self, owner: str, lease_expires_at: datetime, now: datetime, run_ids: list[str] | None = None
    ) -> RunRecord | None:
        candidate, params = (CLAIM_ANY, {"now": now}) if run_ids is None else (CLAIM_AMONG, {"now": now, "run_ids": run_ids})

        async def work(conn: AsyncConnection) -> RunRecord | None:
            run_id = await conn.scalar(candidate, params)
            if run_id is None:
                return None
            started = utcnow()
            claim = {"b_run_id": run_id, "status": RunStatus.running.value, "owner": owner,
                     "lease_expires_at": lease_expires_at, "started_at": started, "updated_at": started}
            row = await _one(conn, CLAIM, claim)
            if row is None:
                return None
            await conn.execute(UPDATE_THREAD, {"b_thread_id": row["thread_id"], "status": "busy", "updated_at": started})
            return _to_run(row)

        try:
            return await self._db.transaction(work)
        except IntegrityError as exc:
            if is_unique_violation(exc):  # another process started a run of that thread first
                return None
            raise

    async def next_start_at(self) -> datetime | None:
        query = select(func.min(runs.c.not_before).label("at")).where(
            runs.c.status == RunStatus.pending.value, runs.c.not_before > utcnow()
        )
        found = await self._db.rows(query)
        return as_utc(found[0]["at"]) if found else None

    async def renew_leases(
        self, owner: str, lease_expires_at: datetime, leases: Sequence[Lease]
    ) -> dict[str, RunRecord | None]:
        greatest = func.max if self._db.dialect == "sqlite" else func.greatest

        async def work(conn: AsyncConnection) -> dict[str, RunRecord | None]:
            renewed: dict[str, RunRecord | None] = {}
            now = utcnow()
            for lease in leases:
                statement = (
                    _fenced_update(lease.run_id, lease.attempt, RunStatus.running.value)
                    .where(runs.c.owner == owner)
                    .values(
                        lease_expires_at=lease_expires_at, updated_at=now,
                        stream_seq=greatest(runs.c.stream_seq, lease.stream_seq),
                    )
                    .returning(*RUN_COLUMNS)
                )
                row = await _one(conn, statement)
                renewed[lease.run_id] = _to_run(row) if row is not None else None
            return renewed

        return await self._db.transaction(work)

    async def expired_runs(self, now: datetime, limit: int = 100) -> list[RunRecord]:
        query = (
            select(*RUN_COLUMNS)
            .where(runs.c.status == RunStatus.running.value, runs.c.lease_expires_at < now)
            .order_by(runs.c.lease_expires_at, runs.c.run_id)
            .limit(limit)
        )
        return [_to_run(row) for row in await self._db.rows(query)]

    async def claim(
        self, run_id: str, owner: str, lease_expires_at: datetime | None, *, attempt: int | None = None
    ) -> RunRecord:
        statement = update(runs).where(runs.c.run_id == run_id, runs.c.status.in_(ACTIVE_VALUES))
        if attempt is not None:
            statement = statement.where(runs.c.attempt == attempt)
        statement = statement.values(
            attempt=runs.c.attempt + 1,
            owner=owner,
            lease_expires_at=lease_expires_at,
            updated_at=utcnow(),
        )
        return await self._fenced(run_id, attempt, statement)

    async def request_control(self, run_id: str, control: dict[str, Any]) -> RunRecord:
        statement = (
            update(runs)
            .where(
                runs.c.run_id == run_id, runs.c.status.in_(ACTIVE_VALUES), runs.c.control.is_(None)
            )
            .values(control=control, updated_at=utcnow())
        )
        try:
            return await self._fenced(run_id, None, statement)
        except FencedOut:
            current = await self.get(run_id)
            if current is not None and current.control is not None and not current.status.terminal:
                return current  # an earlier request stands
            raise

    async def pg_notify(self, channel: str, payload: str) -> None:
        """``NOTIFY`` through this store's own connections (PostgreSQL only)."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(select(func.pg_notify(channel, payload)))

        await self._db.transaction(work)

    # -- reads -------------------------------------------------------------------------------
    async def get(self, run_id: str) -> RunRecord | None:
        found = await self._db.rows(RUN, {"run_id": run_id})
        return _to_run(found[0]) if found else None

    async def list_runs(
        self,
        thread_id: str | None = None,
        statuses: list[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        query = select(*RUN_COLUMNS)
        if thread_id is not None:
            query = query.where(runs.c.thread_id == thread_id)
        if statuses is not None:
            query = query.where(runs.c.status.in_([s.value for s in statuses]))
        query = (
            query.order_by(runs.c.created_at.desc(), runs.c.queue_seq.desc(), runs.c.run_id.desc())
            .limit(limit)
            .offset(offset)
        )
        return [_to_run(row) for row in await self._db.rows(query)]

    async def count_runs(self, statuses: list[RunStatus]) -> dict[RunStatus, int]:
        query = select(runs.c.status, func.count().label("n")).where(runs.c.status.in_([s.value for s in statuses]))
        found = {row["status"]: row["n"] for row in await self._db.rows(query.group_by(runs.c.status))}
        return {s: int(found.get(s.value, 0)) for s in statuses}

    async def active_runs(self, thread_id: str) -> list[RunRecord]:
        return [_to_run(row) for row in await self._db.rows(ACTIVE, {"thread_id": thread_id})]

    async def delete_run(self, run_id: str) -> bool:
        async def work(conn: AsyncConnection) -> bool:
            await conn.execute(delete(journal).where(journal.c.run_id == run_id))
            return (await conn.execute(delete(runs).where(runs.c.run_id == run_id))).rowcount > 0

        return await self._db.transaction(work)

    # -- threads -----------------------------------------------------------------------------
    async def upsert_thread(
        self, thread_id: str, metadata: dict[str, Any] | None = None
    ) -> ThreadRecord:
        """Create the thread, or merge ``metadata`` into the existing thread's."""

        async def work(conn: AsyncConnection) -> ThreadRecord:
            now = utcnow()
            current = await self._lock_thread(conn, thread_id, now)
            merged = {**current["metadata"], **(metadata or {})}
            row = await _one(conn, UPDATE_THREAD_RETURNING, {"b_thread_id": thread_id, "metadata": merged, "updated_at": now})
            assert row is not None
            return _to_thread(row)

        return await self._db.transaction(work)

    async def create_thread(self, thread_id: str, metadata: dict[str, Any]) -> ThreadRecord | None:
        now = utcnow()
        params = {"thread_id": thread_id, "status": "idle", "metadata": metadata, "created_at": now, "updated_at": now}
        row = await self._db.transaction(lambda conn: _one(conn, self._create_thread, params), single=True)
        return _to_thread(row) if row is not None else None

    async def get_thread(self, thread_id: str) -> ThreadRecord | None:
        found = await self._db.rows(THREAD, {"thread_id": thread_id})
        return _to_thread(found[0]) if found else None

    async def set_thread_status(self, thread_id: str, status: str, *, unless_running: bool = False) -> None:
        require_thread_status(status)
        statement = UPDATE_THREAD_UNLESS_RUNNING if unless_running else UPDATE_THREAD
        await self._db.write(statement, [{"b_thread_id": thread_id, "status": status, "updated_at": utcnow()}])

    async def list_threads(self, limit: int = 100, offset: int = 0) -> list[ThreadRecord]:
        query = (
            select(threads)
            .order_by(threads.c.created_at.desc(), threads.c.thread_id.desc())
            .limit(limit)
            .offset(offset)
        )
        return [_to_thread(row) for row in await self._db.rows(query)]

    async def delete_thread(self, thread_id: str) -> bool:
        """Delete the thread; its runs go by ``ON DELETE CASCADE``, its journal explicitly."""

        async def work(conn: AsyncConnection) -> bool:
            await conn.execute(delete(journal).where(journal.c.thread_id == thread_id))
            statement = delete(threads).where(threads.c.thread_id == thread_id)
            return (await conn.execute(statement)).rowcount > 0

        return await self._db.transaction(work)
