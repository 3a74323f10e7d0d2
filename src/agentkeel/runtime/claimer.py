"""The worker loop of one process: claim startable runs, execute them, recover lost ones.

Operations (admission, cancellation) live in ``manager.py`` and only write to the store and send a
wake-up; this loop is what executes. Any number of processes may run it against one database:

* **Claiming.** ``RunStore.claim_next`` hands each startable run (head of its thread's queue, thread
  not running anything, delay passed) to exactly one worker. The loop claims while it has capacity
  (``limits.worker_max_runs``), then sleeps until a wake-up (a run admitted, a thread freed: a
  PostgreSQL NOTIFY from any process, or this process's own), the next delayed start, or the safety
  sweep (``limits.claim_poll_s`` where the store cannot wake other processes, else a lease period).
* **Leases.** ``LeaseKeeper`` renews the leases of every run executing here and carries out stored
  control requests; a wake-up for a run's control request triggers an immediate renewal.
* **Recovery.** At start-up and on every sweep, ``Recovery`` takes over runs whose lease expired or
  whose owner on this host is dead.

Each claimed run is rebuilt from its stored record (``request_from_record`` → ``prepare_run``), the
same way whichever process admitted it: a run's record is enough to execute it anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from agentkeel.config import Limits
from agentkeel.harness.agents import Harness
from agentkeel.runtime.active import ActiveRun
from agentkeel.runtime.leases import LeaseKeeper, apply_control
from agentkeel.runtime.notify import CONTROL, WAKE, Notifier
from agentkeel.runtime.records import Completion, FencedOut, RunRecord, RunStatus, empty_usage, utcnow
from agentkeel.runtime.recovery import Recovery
from agentkeel.runtime.requests import prepare_run, request_from_record
from agentkeel.runtime.stores.base import StartClaim
from agentkeel.runtime.worker import WorkerDeps, execute_run

log = logging.getLogger(__name__)

ERROR_BACKOFF_S = (0.2, 5.0)


@dataclass(frozen=True)
class AdmissionClaim(StartClaim):
    """A ``StartClaim`` offered by this worker to an admission; ``sent``: when it was made (the
    lease keeper counts the lease from it)."""

    sent: float = 0.0


class Claimer:
    def __init__(
        self,
        deps: WorkerDeps,
        harness: Harness,
        limits: Limits,
        notifier: Notifier,
        runs: dict[str, ActiveRun],
        keeper: LeaseKeeper,
        on_finished: Callable[[ActiveRun], Awaitable[None]],
        on_started: Callable[[], None] = lambda: None,
        only: set[str] | None = None,
    ) -> None:
        """``only``: claim just these runs (the manager adds the runs it admits) and recover none;
        None: any run, and recover lost ones."""
        self._deps = deps
        self._harness = harness
        self._limits = limits
        self._notifier = notifier
        self._runs = runs
        self._keeper = keeper
        self._on_finished = on_finished
        self._on_started = on_started
        self._only = only
        self._wake = asyncio.Event()
        self._passed_once = asyncio.Event()  # the claim loop has looked at the queue (``start``)
        self._context = contextvars.copy_context()
        self._claiming = False
        self._tasks: list[asyncio.Task[None]] = []
        self._reserved = 0  # places held by claims under way (``_place``)
        self.recovery = Recovery(
            deps.store, deps.journal_store, deps.bridge, deps.owner, keeper.expiry,
            limits.stream_retention, policy=self._policy, resume=self._launch_resumed, on_freed=self._freed,
            metrics=deps.metrics, completion_hooks=deps.completion_hooks, hook_bound_s=limits.finalize_step_s,
        )
        notifier.add_listener(self._heard)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._claiming = True
        # Runs execute in a copy of this context, never in that of whoever happened to launch them
        # (an admission's request handler, with whatever its framework put in context variables).
        self._context = contextvars.copy_context()
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="agentkeel-claim"),
            asyncio.create_task(self._keeper.run_forever(), name="agentkeel-leases"),
        ]
        if self._only is None:
            await self.recovery.sweep()  # the dead runs of a previous process first
            self._tasks.append(asyncio.create_task(self._sweep_loop(), name="agentkeel-recovery"))
        # Return once the claim loop's first pass is over, so that the worker is quiet when the
        # first admissions come: one made right after start would otherwise find the loop's
        # start-up claim holding a place, and be left pending for the loop's next turn although
        # a place was free by then.
        await self._passed_once.wait()

    def stop_claiming(self) -> None:
        """Claim nothing more (shutdown); runs already executing keep their leases renewed."""
        self._claiming = False
        self._wake.set()

    async def close(self) -> None:
        self._claiming = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    def wake(self) -> None:
        self._wake.set()

    # -- the loops ---------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        delay = ERROR_BACKOFF_S[0]
        while self._claiming:
            self._wake.clear()
            try:
                while await self._claim_one():
                    pass
                timeout = await self._sleep_for()
                delay = ERROR_BACKOFF_S[0]
            except Exception as exc:
                log.warning("claiming runs failed, retrying in %.1f s: %r", delay, exc)
                timeout, delay = delay, min(delay * 2, ERROR_BACKOFF_S[1])
            finally:
                self._passed_once.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _sleep_for(self) -> float:
        idle = self._keeper.interval_s if self._notifier.cross_process else self._limits.claim_poll_s
        next_start = await self._deps.store.next_start_at()
        if next_start is not None:
            idle = min(idle, max((next_start - utcnow()).total_seconds(), 0.0) + 0.01)
        return idle

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._keeper.interval_s)
            try:
                await self.recovery.sweep()
            except Exception as exc:  # e.g. the database is unreachable: the next sweep retries
                log.warning("recovery sweep failed, retrying at the next interval: %r", exc)

    async def _claim_one(self) -> bool:
        """Claim and launch the oldest startable run if this worker has a place; whether it did."""
        if self._only is not None and not self._only:
            return False
        with self._place() as free:
            if not free:
                return False
            sent = time.monotonic()
            record = await self._deps.store.claim_next(
                self._deps.owner, self._keeper.expiry(), utcnow(),
                run_ids=None if self._only is None else sorted(self._only),
            )
            if record is None:
                return False
            if self._only is not None:
                self._only.discard(record.run_id)
            self._launch(record, sent)
            return True

    @contextlib.contextmanager
    def _place(self) -> Iterator[bool]:
        """A place within ``limits.worker_max_runs``, held until the block ends (by then the run
        claimed in it is launched and counts itself); False when none is free or this worker
        stopped claiming. Held across the claim's await, so the claim loop and admissions
        claiming at once never take more places than there are."""
        if not self._claiming or len(self._runs) + self._reserved >= self._limits.worker_max_runs:
            yield False
            return
        self._reserved += 1
        try:
            yield True
        finally:
            self._reserved -= 1

    @contextlib.contextmanager
    def admission_claim(self) -> Iterator[AdmissionClaim | None]:
        """A claim for an admission made by this process (``RunStore.admit``), holding a place
        within ``limits.worker_max_runs`` until the block ends; None when this worker takes
        nothing now (no capacity, or shutting down), and the run is then left pending for the
        claim loop.

        Why claim at admission instead of leaving it to the loop: under load the loop's task gets
        its turn only after every other ready task has had one, so a new run's start would wait
        behind the steps of every run already executing; and the claim rides in the admission's
        transaction instead of a second one. The store claims only a run that ``claim_next``
        would hand out (nothing active on its thread, no delay), so its thread's FIFO and
        exactly-one-owner guarantees hold. A run the admission stored as running must be handed
        to ``launch`` inside the block.
        """
        with self._place() as free:
            sent = time.monotonic()  # before the expiry it stands for: the lease is counted from here
            yield AdmissionClaim(self._deps.owner, self._keeper.expiry(), sent=sent) if free else None

    def launch(self, record: RunRecord, claim: AdmissionClaim, release_start: Callable[[], None]) -> None:
        """Execute a run its admission claimed (``admission_claim``). ``release_start``: the
        admission's hold on the start gate, which the run takes over."""
        self._launch(record, claim.sent, release_start=release_start)

    # -- executing ---------------------------------------------------------------------------
    def _launch(
        self, record: RunRecord, sent: float, resumed_from: int | None = None,
        release_start: Callable[[], None] | None = None,
    ) -> None:
        try:
            prepared = prepare_run(request_from_record(record), self._harness, self._limits)
        except Exception as exc:  # e.g. the assistant was removed from the config since admission
            if release_start is not None:
                release_start()
            self._spawn(self._refuse(record, exc), f"agentkeel-refuse-{record.run_id}")
            return
        if release_start is None:
            release_start = self._deps.start_gate.hold()
        active = ActiveRun(record, prepared, resumed_from=resumed_from, release_start=release_start)
        self._keeper.start_lease(active, sent)
        self._runs[record.run_id] = active
        if record.control is not None:
            apply_control(active, record.control)  # stored before the claim: stop at once
        active.task = asyncio.create_task(
            self._execute(active), name=f"agentkeel-run-{record.run_id}", context=self._context.copy()
        )
        active.task.add_done_callback(lambda _task: active.release_start())  # even if it never ran
        self._on_started()

    def _launch_resumed(self, record: RunRecord, lost_attempt: int) -> None:
        self._launch(record, time.monotonic(), resumed_from=lost_attempt)

    async def _execute(self, active: ActiveRun) -> None:
        try:
            await execute_run(self._deps, active)
        finally:
            self._runs.pop(active.record.run_id, None)
            active.done.set()
            await self._on_finished(active)

    async def _refuse(self, record: RunRecord, exc: Exception) -> None:
        """A claimed run that cannot be built here ends ``error`` at once, with its END."""
        error = f"{type(exc).__name__}: {exc}"
        log.error("run %s cannot be executed: %s", record.run_id, error)
        try:
            await self._deps.store.finish(record.run_id, record.attempt, Completion(
                RunStatus.error, [], empty_usage(), error, acknowledges_control=True,
            ), thread_status="error")
        except FencedOut:
            return
        await self._deps.bridge.publish_end(record.run_id)  # a backend fault only degrades it
        await self._freed(record.thread_id)

    # -- notifications -----------------------------------------------------------------------
    def _heard(self, topic: str, run_id: str) -> None:
        if topic == WAKE:
            self._wake.set()
        elif topic == CONTROL and run_id in self._runs:  # renewing reads the stored request
            self._spawn(self._keeper.renew(self._runs[run_id]), f"agentkeel-control-{run_id}")

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """A background task ``close`` cancels, forgotten once done."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.append(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    async def _freed(self, thread_id: str) -> None:
        await self._notifier.notify(WAKE)

    def _policy(self, record: RunRecord) -> str:
        assistant = self._deps.config.assistant(record.assistant_id)
        return assistant.on_worker_lost if assistant is not None else "fail"


__all__ = ["AdmissionClaim", "Claimer"]
