"""Rules every store applies the same way, so the memory and SQL stores cannot drift apart.

The stores differ in *how* a check and its write are made atomic (an asyncio lock, a conditional
``UPDATE``); *what* is checked and how a refusal is explained lives here.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, overload

from agentkeel.runtime.records import (
    ACTIVE_STATUSES,
    ConflictError,
    ControlPending,
    FencedOut,
    InvalidTransition,
    MultitaskStrategy,
    RunRecord,
    RunStatus,
)
from agentkeel.runtime.stores.base import StartClaim

THREAD_STATUSES = frozenset({"idle", "busy", "interrupted", "error"})
ACTIVE_VALUES = tuple(sorted(s.value for s in ACTIVE_STATUSES))


def check_admissible(record: RunRecord, active: list[RunRecord]) -> None:
    """Refuse an admission before anything is written.

    ``active`` are the thread's pending/running runs, read under the same lock as the insert.
    """
    if record.status is not RunStatus.pending:
        raise InvalidTransition(f"a run is admitted as pending, not {record.status.value}")
    if record.multitask_strategy is MultitaskStrategy.reject and active:
        ids = ", ".join(r.run_id for r in active)
        raise ConflictError(f"thread {record.thread_id} already has an active run ({ids})")


def admitted_record(record: RunRecord, active: list[RunRecord], claim: StartClaim | None, now: datetime) -> RunRecord:
    """What an admission stores: ``record`` itself, or -- when a ``claim`` is offered and the run
    can start as it is admitted (nothing active on its thread, no delay) -- the run claimed by it,
    as ``claim_next`` would leave it (``RunStore.admit``)."""
    if claim is None or active or record.not_before is not None:
        return record
    return dataclasses.replace(
        record, status=RunStatus.running, owner=claim.owner, lease_expires_at=as_utc(claim.lease_expires_at),
        started_at=now, updated_at=now,
    )


def require_terminal(status: RunStatus) -> None:
    """``finish`` may only write an end state; anything else is a caller bug, not a fence."""
    if not status.terminal:
        raise InvalidTransition(f"finish needs a terminal status, got {status.value}")


def require_thread_status(status: str) -> None:
    if status not in THREAD_STATUSES:
        raise ValueError(f"thread status must be one of {sorted(THREAD_STATUSES)}, got {status!r}")


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: datetime | None) -> datetime | None: ...
def as_utc(value: datetime | None) -> datetime | None:
    """Records carry tz-aware UTC; SQLite hands back naive values, which were written as UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def fenced_out(run_id: str, attempt: int | None, current: RunRecord | None) -> FencedOut:
    """Explain a refused write, so a log line says *why* a late writer lost.

    ``attempt`` is None for writes that do not name one (``claim``).
    """
    if current is None:
        return FencedOut(f"run {run_id} does not exist")
    if current.status.terminal:
        return FencedOut(f"run {run_id} already ended with status {current.status.value}")
    if attempt is not None and current.attempt > attempt:
        return FencedOut(
            f"run {run_id} attempt {attempt} was superseded by attempt {current.attempt}"
        )
    if attempt is not None and current.attempt != attempt:
        return FencedOut(f"run {run_id} has no attempt {attempt} (current: {current.attempt})")
    return FencedOut(f"run {run_id} is {current.status.value}, not in a state this write expects")


def control_pending(run_id: str, control: dict[str, Any]) -> ControlPending:
    return ControlPending(
        f"run {run_id} has a stored {control.get('action', 'control')} request "
        f"({control.get('code')}) that this completion does not carry out",
        control,
    )


def startable(record: RunRecord, now: datetime) -> bool:
    """A pending run's delay (``not_before``) has passed."""
    return record.not_before is None or as_utc(record.not_before) <= now
