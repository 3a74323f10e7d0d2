"""The durable run record and the rules for changing it.

A run's status follows LangGraph's enum. Two invariants make the record trustworthy:

* a terminal status is never replaced (``check_transition``), and
* every write after admission names the attempt it belongs to, so a writer whose attempt was
  superseded (a new owner took the run over) is fenced out instead of overwriting the newer result.

Both are enforced by every store (the SQL stores in the ``WHERE`` clause of the same statement that
writes), and the shared conformance suite checks them.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


class RunStatus(enum.StrEnum):
    pending = "pending"
    running = "running"
    success = "success"
    error = "error"
    timeout = "timeout"
    interrupted = "interrupted"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RunStatus.success, RunStatus.error, RunStatus.timeout, RunStatus.interrupted}
)
ACTIVE_STATUSES = frozenset({RunStatus.pending, RunStatus.running})

_ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.pending: frozenset({RunStatus.running, *TERMINAL_STATUSES}),
    RunStatus.running: TERMINAL_STATUSES,
}


class MultitaskStrategy(enum.StrEnum):
    reject = "reject"
    interrupt = "interrupt"
    rollback = "rollback"
    enqueue = "enqueue"


class OnDisconnect(enum.StrEnum):
    cancel = "cancel"
    continue_ = "continue"


class InvalidTransition(Exception):
    """A status change the state machine forbids (e.g. replacing a terminal status)."""


class FencedOut(Exception):
    """A write from an attempt that no longer owns the run (or a run already finished) was refused."""


class ConflictError(Exception):
    """Admission refused: the thread already has an active run and the strategy is ``reject``."""


class ControlPending(FencedOut):
    """A completion that ignores a stored control request (a cancel that was first) was refused.

    First action wins: a cancel, interrupt or rollback request stored while the run was active
    outranks a completion written after it. The owner re-reads ``control`` and ends the run as the
    request says.
    """

    def __init__(self, message: str, control: dict[str, Any]) -> None:
        super().__init__(message)
        self.control = control


class RunNotFound(LookupError):
    pass


def check_transition(current: RunStatus, new: RunStatus) -> None:
    if new not in _ALLOWED.get(current, frozenset()):
        raise InvalidTransition(f"run status {current.value} -> {new.value} is not allowed")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_run_id() -> str:
    return str(uuid.uuid4())


def empty_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 0,
        "by_caller": {},
        "by_model": {},
    }


FIRST_ATTEMPT = 1  # a run's attempt when admitted; each takeover by another owner adds one


@dataclass
class RunRecord:
    run_id: str
    thread_id: str
    assistant_id: str
    status: RunStatus = RunStatus.pending
    attempt: int = FIRST_ATTEMPT
    owner: str | None = None
    lease_expires_at: datetime | None = None
    multitask_strategy: MultitaskStrategy = MultitaskStrategy.reject
    on_disconnect: OnDisconnect = OnDisconnect.continue_
    kwargs: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    stop_reasons: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=empty_usage)
    error: str | None = None
    # Why a failed run failed, as data: {type, message, kind, status, code, attempts, model, use,
    # key_env} (model fields set when a model call failed); None for a run that did not fail.
    error_detail: dict[str, Any] | None = None
    # A pending run is not claimed before this instant (``after_seconds``).
    not_before: datetime | None = None
    # A stored cancel / interrupt / rollback request (first one wins), read by the owner wherever
    # it runs: {action, code, source, detail, refused_code}.
    control: dict[str, Any] | None = None
    # The last stream event id the owner reported (with its lease renewals), so a later attempt in
    # another process continues the stream's ids instead of reusing them.
    stream_seq: int = 0

    @property
    def stop_reason(self) -> str | None:
        """The primary stop reason code (see ``harness.stop_reasons.primary``)."""
        from agentkeel.harness.stop_reasons import primary_code

        return primary_code(self.stop_reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "status": self.status.value,
            "attempt": self.attempt,
            "owner": self.owner,
            "lease_expires_at": _iso(self.lease_expires_at),
            "multitask_strategy": self.multitask_strategy.value,
            "on_disconnect": self.on_disconnect.value,
            "kwargs": self.kwargs,
            "metadata": self.metadata,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "stop_reasons": self.stop_reasons,
            "stop_reason": self.stop_reason,
            "usage": self.usage,
            "error": self.error,
            "error_detail": self.error_detail,
            "not_before": _iso(self.not_before),
            "control": self.control,
        }


@dataclass(frozen=True)
class Completion:
    """Everything the worker writes when a run ends, as one fenced write."""

    status: RunStatus
    stop_reasons: list[dict[str, Any]]
    usage: dict[str, Any]
    error: str | None = None
    # True when this completion is the owner carrying out the run's stored control request; a
    # completion that does not acknowledge a stored request is refused (``ControlPending``).
    acknowledges_control: bool = False
    error_detail: dict[str, Any] | None = None  # why a failed run failed, as data


@dataclass
class ThreadRecord:
    thread_id: str
    status: str = "idle"  # idle | busy | interrupted | error
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


# What a process runs when one of its runs ends (run metrics, traces, the gateway's own hooks).
CompletionHook = Callable[[RunRecord], Awaitable[None]]
