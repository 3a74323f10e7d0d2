"""In-process state of a run this process owns while it executes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentkeel.runtime.journal import Journal
from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.requests import PreparedRun

CancelAction = Literal["interrupt", "rollback"]


@dataclass(frozen=True)
class AbortRequest:
    """Why a run is being stopped from outside, decided once by whoever stops it first."""

    action: CancelAction
    code: str  # stop reason code: cancelled | interrupted_by_new_run | rolled_back | client_disconnected
    source: str  # manager | gateway | worker
    detail: str = ""
    # The code recorded instead when a requested rollback is refused (nothing safe to restore).
    refused_code: str = "cancelled"
    # Carries out the run's stored control request (so the completion acknowledges it).
    from_control: bool = False

    def to_control(self) -> dict[str, Any]:
        """The durable form stored on the run record (``RunStore.request_control``)."""
        return {"action": self.action, "code": self.code, "source": self.source,
                "detail": self.detail, "refused_code": self.refused_code}

    @classmethod
    def from_stored(cls, control: dict[str, Any]) -> AbortRequest:
        action = control.get("action")
        return cls(
            action="rollback" if action == "rollback" else "interrupt",
            code=str(control.get("code") or "cancelled"),
            source=str(control.get("source") or "manager"),
            detail=str(control.get("detail") or ""),
            refused_code=str(control.get("refused_code") or "cancelled"),
            from_control=True,
        )


@dataclass
class ActiveRun:
    """A run this process claimed and executes (under its lease) until its task ends."""

    record: RunRecord
    prepared: PreparedRun
    # time.monotonic() by which the lease must be confirmed again; past it the run is fenced.
    lease_deadline: float = 0.0
    task: asyncio.Task[None] | None = None
    abort: AbortRequest | None = None
    # The lease is lost: another attempt may own the run now, so this one writes nothing more.
    fenced: bool = False
    # Set when this attempt continues a run whose previous owner was lost (``on_worker_lost:
    # resume``): the previous attempt, for the journal and the tool-call ledger.
    resumed_from: int | None = None
    # The run's journal once opened (the lease keeper fences it the moment the lease is lost).
    journal: Journal | None = None
    # Set by the worker before its first await: from then on a cancel lands inside its ``try``.
    # A task cancelled before it ever ran would skip finalization (no status, no END), so such a
    # run is only flagged, and the worker sees the flag when it starts.
    executing: bool = False
    # Set by the worker when it enters finalization: from then on cancelling changes nothing.
    finalizing: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Releases this run's hold on the process's start gate (``runtime/start_gate.py``): called
    # once its first chunk is published, or when it ends without one.
    release_start: Callable[[], None] = field(default=lambda: None)
    _enforcer: asyncio.Task[None] | None = None

    def coordinate(self) -> dict[str, Any]:
        """What an event published now is stamped with: the journal's coordinate once the
        journal is open, else the run and attempt alone."""
        if self.journal is not None:
            return self.journal.coordinate()
        return {"run_id": self.record.run_id, "attempt": self.record.attempt, "step": None, "journal_seq": 0}

    def request_abort(self, abort: AbortRequest) -> bool:
        """Record the first abort request and cancel the task; later requests change nothing."""
        if self.abort is not None:
            return False
        self.abort = abort
        if self.executing and self.task is not None and not self.task.done():
            self.task.cancel()
            self._enforcer = asyncio.create_task(self._enforce_cancel())
        return True

    async def _enforce_cancel(self, every_s: float = 0.25) -> None:
        """Repeat the cancel until the worker is finalizing.

        On Python 3.11 ``asyncio.wait_for`` (used inside redis-py, psycopg_pool and LangGraph)
        can swallow a cancel that lands as its inner await completes (CPython gh-86296); the
        run would then go on to its next long await. Re-cancelling closes that window.
        """
        while self.task is not None and not self.task.done() and not self.finalizing:
            await asyncio.sleep(every_s)
            if not self.finalizing and not self.task.done():
                self.task.cancel()
