"""RunManager: admission, multitask strategies, queueing and cancellation.

Operations live here; executing a run lives in ``worker.py`` (the procrastinate split). The manager
keeps in memory only the runs this process admitted and has not finished — bounded by what is in
flight; everything else is read from the store.

Strategies when a thread already has an active run:

``reject``     the store refuses admission atomically (``ConflictError``); nothing is written.
``interrupt``  older runs end ``interrupted`` (stop reason ``interrupted_by_new_run``); their
               checkpoints stay; the new run starts when they have finalized.
``rollback``   older runs are stopped and their checkpoints and workspace changes undone, then the
               runs are deleted; the new run starts on the restored state.
``enqueue``    FIFO per thread: the next run starts the moment the active one ends (woken by the
               finishing run, never polled).

Everything here works the same whichever process executes the run: admission is a store write and
a wake-up (``notify.WAKE``); stopping a run stores a control request (the first one wins, also
against the run's own completion) and wakes its owner, wherever it runs (``notify.CONTROL``); a
stopped run whose owner died is completed by recovery. Executing lives in ``claimer.py`` and
``worker.py``; a process started without a worker (``keel serve --no-worker``) only admits,
controls and reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from agentkeel.config import Limits
from agentkeel.harness.agents import Harness
from agentkeel.harness.stop_reasons import StopReason
from agentkeel.harness.tool_replay import ToolReplay
from agentkeel.runtime.active import AbortRequest, ActiveRun, CancelAction
from agentkeel.runtime.claimer import AdmissionClaim, Claimer
from agentkeel.runtime.leases import LeaseKeeper, apply_control
from agentkeel.runtime.notify import CONTROL, WAKE, Notifier
from agentkeel.runtime.records import (
    Completion,
    ConflictError,
    FencedOut,
    MultitaskStrategy,
    RunRecord,
    RunStatus,
    empty_usage,
    new_run_id,
    utcnow,
)
from agentkeel.runtime.requests import PreparedRun, RequestError, RunRequest, prepare_run
from agentkeel.runtime.start_gate import StartGate
from agentkeel.runtime.stores.base import RunStore
from agentkeel.runtime.worker import WorkerDeps

log = logging.getLogger(__name__)


class CancelOutcome(enum.StrEnum):
    cancelled = "cancelled"  # stopping now, or already stopped by a cancel (idempotent)
    already_finished = "already_finished"  # ended on its own before the cancel
    not_found = "not_found"


class ShuttingDown(RuntimeError):
    """The manager no longer admits runs."""


Executes = Literal["all", "own", "none"]

# How often ``wait`` re-reads a run executed by another process (it is woken by nothing else).
WAIT_POLL_S = 0.25


@dataclass
class _Start:
    """A run's hold on the start gate while it is admitted: handed over to the run when it is
    launched from its admission (the run releases it at its first chunk), released here otherwise."""

    release: Callable[[], None]
    handed_over: bool = False


class RunManager:
    def __init__(
        self, deps: WorkerDeps, harness: Harness, limits: Limits, notifier: Notifier | None = None,
        *, executes: Executes = "all",
    ) -> None:
        """``executes``: which runs this process's worker claims — ``all`` (a worker of the
        deployment: claims any run and recovers lost ones), ``own`` (only the runs this manager
        admitted: ``keel run`` on a shared database), ``none`` (``keel serve --no-worker``)."""
        self._deps = deps
        self._harness = harness
        self._limits = limits
        self._notifier = notifier or Notifier()
        self._active: dict[str, ActiveRun] = {}
        self._accepting = True
        self._changed = asyncio.Event()  # set (and replaced) whenever a run starts or ends here
        self.keeper = LeaseKeeper(deps.store, deps.owner, limits.lease_ttl_s, self._active, deps.bridge.last_seq)
        # Runs admitted here and not yet claimed, for ``executes="own"``.
        self._own: set[str] | None = set() if executes == "own" else None
        self.claimer = (
            Claimer(
                deps, harness, limits, self._notifier, self._active, self.keeper, self._finished,
                on_started=self._signal_change, only=self._own,
            )
            if executes != "none" else None
        )

    @property
    def start_gate(self) -> StartGate:
        """This process's start gate: runs being started (and, in a gateway, requests being
        answered) go before the chunks of runs already streaming (``runtime/start_gate.py``)."""
        return self._deps.start_gate

    @property
    def owner(self) -> str:
        """This process's worker identity: ``host:pid:nonce``."""
        return self._deps.owner

    @property
    def store(self) -> RunStore:
        return self._deps.store

    @property
    def tool_replays(self) -> dict[str, ToolReplay]:
        """Re-runs whose tool calls the recording answers, by thread id (``runtime/replay.py``
        registers one before it creates the run; the worker hands it to the run's context)."""
        return self._deps.tool_replays

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def active(self, run_id: str) -> ActiveRun | None:
        return self._active.get(run_id)

    async def start(self) -> None:
        """Start this process's worker loop (claims, leases, recovery), if it has one."""
        await self._notifier.start()
        if self.claimer is not None:
            await self.claimer.start()

    # -- admission ---------------------------------------------------------------------------
    async def create(self, request: RunRequest) -> RunRecord:
        if not self._accepting:
            raise ShuttingDown("the runtime is shutting down and admits no new runs")
        # Running runs step aside while this one is admitted and started; the hold goes to the run
        # when it is launched from here, and is released here otherwise.
        start = _Start(await self._deps.start_gate.start())
        try:
            return await self._admit(request, start)
        finally:
            if not start.handed_over:
                start.release()

    async def _admit(self, request: RunRequest, start: _Start) -> RunRecord:
        prepared = prepare_run(request, self._harness, self._limits)  # before admission
        await self._check_checkpoint(prepared)
        now = utcnow()
        record = RunRecord(
            run_id=new_run_id(),
            thread_id=request.thread_id,
            assistant_id=request.assistant_id,
            multitask_strategy=request.multitask_strategy,
            on_disconnect=request.on_disconnect,
            kwargs=prepared.kwargs(),
            metadata=dict(request.metadata),
            created_at=now,
            updated_at=now,
            not_before=now + timedelta(seconds=request.after_seconds) if request.after_seconds else None,
        )
        with self._admission_claim() as claim:
            result = await self._deps.store.admit(record, claim, request.thread_metadata)
            if result.record.status is RunStatus.running:
                # Claimed by its admission (it could start at once): started here and now, so its
                # start does not wait for the claim loop's next turn behind every other run's work.
                assert self.claimer is not None and claim is not None
                self.claimer.launch(result.record, claim, start.release)
                start.handed_over = True
            elif self._own is not None:
                self._own.add(record.run_id)
        strategy = request.multitask_strategy
        if strategy in (MultitaskStrategy.interrupt, MultitaskStrategy.rollback):
            action: CancelAction = "rollback" if strategy == MultitaskStrategy.rollback else "interrupt"
            for older in result.active_before:
                await self._stop(
                    older,
                    AbortRequest(
                        action=action,
                        code="rolled_back" if action == "rollback" else "interrupted_by_new_run",
                        source="manager",
                        detail=f"displaced by run {record.run_id} (multitask_strategy={strategy.value})",
                        refused_code="interrupted_by_new_run",
                    ),
                )
        if not start.handed_over:  # pending: for whichever worker can claim it
            await self._wake_workers()
        await self._deps.bridge.announce(record.thread_id)  # wakes the thread's join streams
        return result.record

    def _admission_claim(self) -> contextlib.AbstractContextManager[AdmissionClaim | None]:
        """This process's worker's claim for an admission, if it has a worker."""
        return self.claimer.admission_claim() if self.claimer is not None else contextlib.nullcontext()

    async def _check_checkpoint(self, prepared: PreparedRun) -> None:
        """A fork from a checkpoint that does not exist is refused before admission."""
        configurable = prepared.config.get("configurable", {})
        checkpoint_id = configurable.get("checkpoint_id")
        if checkpoint_id is None:
            return
        found = await self._deps.checkpointer.aget_tuple(
            {"configurable": {k: configurable[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}}
        )
        if found is None:
            raise RequestError("checkpoint_id", f"checkpoint {checkpoint_id} not found", "not_found")

    async def delete_run(self, run_id: str) -> bool:
        """Delete a finished run (record and journal); an active run must be cancelled first."""
        record = await self._deps.store.get(run_id)
        if record is None:
            return False
        if not record.status.terminal or run_id in self._active:
            raise ConflictError(f"run {run_id} is {record.status.value}; cancel it before deleting it")
        return await self._deps.store.delete_run(run_id)

    # -- cancellation ------------------------------------------------------------------------
    async def cancel(
        self, run_id: str, action: CancelAction = "interrupt", *, code: str = "cancelled",
        source: str = "manager", detail: str = "cancelled by request",
    ) -> CancelOutcome:
        """Stop a run wherever it executes. Idempotent: cancelling a cancelled run answers
        ``cancelled`` again."""
        record = await self._deps.store.get(run_id)
        if record is None:
            return CancelOutcome.not_found
        if record.status.terminal:
            return _outcome_of_ended(record)
        abort = AbortRequest(
            action=action, code="rolled_back" if action == "rollback" else code,
            source=source, detail=detail, refused_code=code,
        )
        return await self._stop(record, abort)

    async def wait(self, run_id: str) -> RunRecord | None:
        """Wait until the run has ended; then its stored record (None if it was deleted)."""
        while True:
            active = self._active.get(run_id)
            if active is not None:
                await active.done.wait()
                return await self._deps.store.get(run_id)
            changed = self._changed
            record = await self._deps.store.get(run_id)
            if record is None or record.status.terminal:
                return record
            with contextlib.suppress(TimeoutError):  # woken when a run starts here, else re-read
                await asyncio.wait_for(changed.wait(), WAIT_POLL_S)

    def _signal_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _stop(self, record: RunRecord, abort: AbortRequest) -> CancelOutcome:
        """Store the request (the first one stands, and it outranks a later completion), then
        carry it out: here if this process executes the run, else by waking its owner; a queued
        run ends at once; a run whose owner died is completed by recovery."""
        try:
            stored = await self._deps.store.request_control(record.run_id, abort.to_control())
        except FencedOut:
            ended = await self._deps.store.get(record.run_id)
            return _outcome_of_ended(ended) if ended is not None else CancelOutcome.not_found
        assert stored.control is not None
        active = self._active.get(record.run_id)
        if active is not None:
            apply_control(active, stored.control)
        elif stored.status is RunStatus.pending:
            await self._finish_unstarted(stored, AbortRequest.from_stored(stored.control))
        else:
            await self._notifier.notify(CONTROL, record.run_id)
        return CancelOutcome.cancelled

    async def _finish_unstarted(self, record: RunRecord, abort: AbortRequest) -> None:
        code = abort.refused_code if abort.action == "rollback" else abort.code
        reason = StopReason(code=code, source=abort.source, seq=0, detail=abort.detail + " (before it started)")
        try:
            await self._deps.store.finish_pending(
                record.run_id, record.attempt,
                Completion(RunStatus.interrupted, [reason.to_dict()], empty_usage(), None, True),
            )
        except FencedOut as exc:  # claimed meanwhile: its owner carries out the stored request
            log.info("run %s already left the queue: %s", record.run_id, exc)
            await self._notifier.notify(CONTROL, record.run_id)
            return
        if abort.action == "rollback":
            await self._deps.store.delete_run(record.run_id)
        await self._deps.bridge.publish_end(record.run_id)
        await self._wake_workers()

    # -- execution -----------------------------------------------------------------------------
    async def _finished(self, active: ActiveRun) -> None:
        """A run of ours ended: its thread may have a queued run for any worker to claim."""
        self._signal_change()
        if not active.fenced:
            await self._wake_workers()

    async def _wake_workers(self) -> None:
        if self.claimer is not None:
            self.claimer.wake()
        await self._notifier.notify(WAKE)

    # -- shutdown ------------------------------------------------------------------------------
    async def shutdown(self, drain_s: float = 5.0) -> None:
        """Stop admitting and claiming, give running runs ``drain_s`` to finish, then interrupt the
        rest; every run still in flight is finalized honestly (status, stop reason, END).
        Idempotent: a second call with a shorter bound cuts the wait short."""
        self._accepting = False
        if self.claimer is not None:
            self.claimer.stop_claiming()
        running = [a.task for a in self._active.values() if a.task is not None]
        if running:
            await asyncio.wait(running, timeout=drain_s)
        abort = AbortRequest("interrupt", "cancelled", "worker", "the runtime shut down before the run finished")
        for active in list(self._active.values()):
            active.request_abort(abort)
        remaining = [a.task for a in self._active.values() if a.task is not None]
        if remaining:
            await asyncio.gather(*remaining, return_exceptions=True)
        if self.claimer is not None:
            await self.claimer.close()
        await self._notifier.close()


def _outcome_of_ended(record: RunRecord) -> CancelOutcome:
    cancelled = record.status == RunStatus.interrupted and any(
        e.get("class") == "cancellation" for e in record.stop_reasons
    )
    return CancelOutcome.cancelled if cancelled else CancelOutcome.already_finished

