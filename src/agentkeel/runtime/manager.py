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
"""

from __future__ import annotations

import asyncio
import enum
import logging

from agentkeel.config import Limits
from agentkeel.harness.agents import Harness
from agentkeel.harness.stop_reasons import StopReason
from agentkeel.runtime.active import AbortRequest, ActiveRun, CancelAction
from agentkeel.runtime.records import (
    Completion,
    ConflictError,
    FencedOut,
    MultitaskStrategy,
    RunRecord,
    RunStatus,
    empty_usage,
    new_run_id,
)
from agentkeel.runtime.requests import PreparedRun, RequestError, RunRequest, prepare_run
from agentkeel.runtime.worker import WorkerDeps, execute_run

log = logging.getLogger(__name__)


class CancelOutcome(enum.StrEnum):
    cancelled = "cancelled"  # stopping now, or already stopped by a cancel (idempotent)
    already_finished = "already_finished"  # ended on its own before the cancel
    not_found = "not_found"
    not_owned = "not_owned"  # running in another process; cross-process cancel is a later issue


class ShuttingDown(RuntimeError):
    """The manager no longer admits runs."""


class RunManager:
    def __init__(self, deps: WorkerDeps, harness: Harness, limits: Limits) -> None:
        self._deps = deps
        self._harness = harness
        self._limits = limits
        self._active: dict[str, ActiveRun] = {}
        self._pump_lock = asyncio.Lock()
        self._accepting = True

    @property
    def store(self):  # noqa: ANN201 - convenience for callers holding only the manager
        return self._deps.store

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def active(self, run_id: str) -> ActiveRun | None:
        return self._active.get(run_id)

    # -- admission ---------------------------------------------------------------------------
    async def create(self, request: RunRequest) -> RunRecord:
        if not self._accepting:
            raise ShuttingDown("the runtime is shutting down and admits no new runs")
        prepared = prepare_run(request, self._harness, self._limits)  # before admission
        await self._check_checkpoint(prepared)
        record = RunRecord(
            run_id=new_run_id(),
            thread_id=request.thread_id,
            assistant_id=request.assistant_id,
            multitask_strategy=request.multitask_strategy,
            on_disconnect=request.on_disconnect,
            kwargs=prepared.kwargs(),
            metadata=dict(request.metadata),
            owner=self._deps.owner,
        )
        result = await self._deps.store.admit(record)
        active = ActiveRun(result.record, prepared)
        self._active[record.run_id] = active
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
        await self._pump(request.thread_id)
        return active.record

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
            raise RequestError("checkpoint_id", f"checkpoint {checkpoint_id} not found", status=404)

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
        """Stop a run. Idempotent: cancelling a cancelled run answers ``cancelled`` again."""
        record = self._active[run_id].record if run_id in self._active else await self._deps.store.get(run_id)
        if record is None:
            return CancelOutcome.not_found
        if record.status.terminal:
            cancelled = record.status == RunStatus.interrupted and any(
                e.get("class") == "cancellation" for e in record.stop_reasons
            )
            return CancelOutcome.cancelled if cancelled else CancelOutcome.already_finished
        abort = AbortRequest(
            action=action, code="rolled_back" if action == "rollback" else code,
            source=source, detail=detail, refused_code=code,
        )
        return await self._stop(record, abort)

    async def wait(self, run_id: str) -> RunRecord | None:
        """Wait until a run this process executes has finished; then return its stored record."""
        active = self._active.get(run_id)
        if active is not None:
            await active.done.wait()
        return await self._deps.store.get(run_id)

    async def _stop(self, record: RunRecord, abort: AbortRequest) -> CancelOutcome:
        active = self._active.get(record.run_id)
        if active is not None and active.task is not None:
            active.request_abort(abort)  # the worker finalizes; a repeated request changes nothing
            return CancelOutcome.cancelled
        if record.status == RunStatus.running:
            return CancelOutcome.not_owned
        # Pending (queued, never started): nothing ran, so there is nothing to undo.
        await self._finish_unstarted(record, abort)
        return CancelOutcome.cancelled

    async def _finish_unstarted(self, record: RunRecord, abort: AbortRequest) -> None:
        code = abort.refused_code if abort.action == "rollback" else abort.code
        reason = StopReason(code=code, source=abort.source, seq=0, detail=abort.detail + " (before it started)")
        try:
            await self._deps.store.finish(
                record.run_id, record.attempt,
                Completion(RunStatus.interrupted, [reason.to_dict()], empty_usage(), None),
            )
            if abort.action == "rollback":
                await self._deps.store.delete_run(record.run_id)
        except FencedOut as exc:
            log.info("run %s already left the queue: %s", record.run_id, exc)
        active = self._active.pop(record.run_id, None)
        if active is not None:
            active.done.set()
        await self._deps.bridge.publish_end(record.run_id)

    # -- execution -----------------------------------------------------------------------------
    async def _pump(self, thread_id: str) -> None:
        """Start the thread's oldest pending run if nothing of the thread is running."""
        async with self._pump_lock:
            if not self._accepting:
                return
            queue = await self._deps.store.active_runs(thread_id)
            if any(r.status == RunStatus.running for r in queue):
                return
            if any(a.task is not None and a.record.thread_id == thread_id for a in self._active.values()):
                return  # ours is between admission and mark_running, or still finalizing
            nxt = next((r for r in queue if r.status == RunStatus.pending), None)
            if nxt is None or nxt.run_id not in self._active:
                return  # nothing queued, or the head of the queue belongs to another process
            active = self._active[nxt.run_id]
            active.task = asyncio.create_task(self._execute(active), name=f"agentkeel-run-{nxt.run_id}")

    async def _execute(self, active: ActiveRun) -> None:
        try:
            await execute_run(self._deps, active)
        finally:
            self._active.pop(active.record.run_id, None)
            active.done.set()
            try:
                await self._pump(active.record.thread_id)
            except Exception:  # the next run stays queued; the next admission or finish retries
                log.exception("starting the next run of thread %s failed", active.record.thread_id)

    # -- shutdown ------------------------------------------------------------------------------
    async def shutdown(self, drain_s: float = 5.0) -> None:
        """Stop admitting, give running runs ``drain_s`` to finish, then interrupt the rest.

        Every run still in flight is finalized honestly (status, stop reason, END).
        """
        self._accepting = False
        running = [a.task for a in self._active.values() if a.task is not None]
        if running:
            await asyncio.wait(running, timeout=drain_s)
        abort = AbortRequest("interrupt", "cancelled", "worker", "the runtime shut down before the run finished")
        for active in list(self._active.values()):
            await self._stop(active.record, abort)
        remaining = [a.task for a in self._active.values() if a.task is not None]
        if remaining:
            await asyncio.gather(*remaining, return_exceptions=True)
