"""Recovering runs whose owner was lost: the lease expired, or the owner's process is provably dead.

A live worker claims such a run with a new attempt (the claim names the attempt it takes over, so
of several recoverers exactly one wins, and the lost owner's late writes are fenced out), then
applies the assistant's ``on_worker_lost`` policy:

``fail`` (default)  the run ends ``error`` with stop reason ``worker_lost``; its END is published so
                    no observer waits, and the thread is freed for its next queued run.
``resume``          the run continues from its last checkpoint under the new attempt (the claimer
                    executes it); tool calls that were in flight are handled by the tool-call ledger.

A control request stored before the loss (a cancel that the dead owner never carried out) is
completed here whatever the policy: the run ends ``interrupted`` with the requested stop reason.

What the lost attempt recorded is not thrown away: its stop reasons and token usage are rebuilt
from its journal, so the run record says what the run spent and why, even though the process that
knew it in memory is gone. The recovering process counts the recovery (``RunMetrics.recovered``:
policy and outcome) and, for a run it ends, runs the completion hooks, as the run's own process
would have.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from agentkeel.harness.stop_reasons import StopReason
from agentkeel.runtime.bridge import StreamBridge
from agentkeel.runtime.journal import Journal
from agentkeel.runtime.metrics import RESUMED, RunMetrics
from agentkeel.runtime.records import Completion, CompletionHook, FencedOut, RunRecord, RunStatus, utcnow
from agentkeel.runtime.stores.base import JournalStore, RunStore
from agentkeel.runtime.thread_status import AFTER_RUN
from agentkeel.runtime.usage import UsageAccumulator

log = logging.getLogger(__name__)

# Lost runs recovered at once by one sweep (a dead worker may have held many).
RECOVER_CONCURRENCY = 8

Policy = Callable[[RunRecord], str]  # the run's on_worker_lost: fail | resume
Resume = Callable[[RunRecord, int], None]  # execute the claimed run; the lost attempt


def owner_is_dead(owner: str | None) -> bool:
    """An owner ``host:pid:nonce`` on this host whose process no longer exists."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # this process: its runtime instances shut their runs down themselves
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by someone else
    return False


async def history_of(journal_store: JournalStore, run_id: str) -> tuple[list[dict[str, Any]], UsageAccumulator]:
    """The stop reasons and token usage the run's earlier attempts journaled."""
    events = await journal_store.list(run_id, kinds=["stop_reason", "model.call"])
    usage = UsageAccumulator()
    reasons: list[dict[str, Any]] = []
    for event in events:
        if event.kind == "stop_reason":
            reasons.append(dict(event.data))
        else:
            usage.add(
                event.caller or "lead", str(event.data.get("model") or "unknown"),
                event.data.get("input_tokens"), event.data.get("output_tokens"),
            )
    return reasons, usage


async def continue_stream(bridge: StreamBridge, record: RunRecord, retention: int) -> None:
    """Make a new attempt's stream events continue after every id the lost attempt published.

    Where the stream survived (Redis), the bridge numbers on from its head by itself, and the
    lease-renewal hint (``stream_seq``) is only a floor. Where it did not (the memory bridge died
    with the process, or the Redis key was lost), the lost owner may have published up to a lease
    period past its last hint: skipping one retention window beyond the hint keeps every id new,
    and observers resuming with an old ``Last-Event-ID`` get a ``gap`` (whose count is then an
    upper bound), never an id they saw before.
    """
    floor = record.stream_seq
    if not await bridge.exists(record.run_id):
        floor += retention
    bridge.seed(record.run_id, floor)


class Recovery:
    def __init__(
        self,
        store: RunStore,
        journal_store: JournalStore,
        bridge: StreamBridge,
        owner: str,
        lease_expiry: Callable[[], Any],
        stream_retention: int,
        policy: Policy,
        resume: Resume,
        on_freed: Callable[[str], Any],
        metrics: RunMetrics | None = None,
        completion_hooks: Sequence[CompletionHook] = (),
        hook_bound_s: float = 10.0,
    ) -> None:
        """``completion_hooks`` run for a run that recovery ends (``fail``), each within
        ``hook_bound_s``, as they do for a run that ends where it executed."""
        self._store = store
        self._journal_store = journal_store
        self._bridge = bridge
        self._retention = stream_retention
        self._owner = owner
        self._lease_expiry = lease_expiry
        self._policy = policy
        self._resume = resume
        self._on_freed = on_freed
        self._metrics = metrics or RunMetrics()
        self._hooks = list(completion_hooks)
        self._hook_bound_s = hook_bound_s

    async def sweep(self) -> int:
        """Recover every run whose lease expired or whose owner on this host is dead; how many."""
        lost = {r.run_id: r for r in await self._store.expired_runs(utcnow())}
        for record in await self._store.list_runs(statuses=[RunStatus.running], limit=1000):
            if record.owner != self._owner and owner_is_dead(record.owner):
                lost.setdefault(record.run_id, record)
        gate = asyncio.Semaphore(RECOVER_CONCURRENCY)

        async def one(record: RunRecord) -> bool:
            async with gate:
                try:
                    return await self.recover(record)
                except Exception:
                    log.exception("recovering run %s failed; the next sweep retries", record.run_id)
                    return False

        return sum(await asyncio.gather(*(one(r) for r in lost.values())))

    async def recover(self, record: RunRecord) -> bool:
        try:
            claimed = await self._store.claim(
                record.run_id, self._owner, self._lease_expiry(), attempt=record.attempt
            )
        except FencedOut:
            return False  # another worker recovered it, or it ended meanwhile
        policy = "fail" if claimed.control is not None else self._policy(claimed)
        log.warning("run %s: owner %s lost (attempt %d); recovering with policy %s",
                    record.run_id, record.owner, record.attempt, policy)
        journal = await Journal.open(self._journal_store, claimed.run_id, claimed.thread_id,
                                     attempt=claimed.attempt)
        journal.record("run.recovered", {
            "lost_owner": record.owner, "lost_attempt": record.attempt, "attempt": claimed.attempt,
            "owner": self._owner, "policy": policy,
            "lease_expired_at": record.lease_expires_at.isoformat() if record.lease_expires_at else None,
        }, caller="worker")
        if policy == "resume":
            await journal.close()
            self._resume(claimed, record.attempt)
            self._metrics.recovered(policy, RESUMED)
            return True
        finished = await self._end_lost(claimed, record, journal)
        self._metrics.recovered(policy, finished.status.value)
        await self._run_hooks(finished)
        return True

    async def _run_hooks(self, finished: RunRecord) -> None:
        """The completion hooks of a run this process ended; one failing never skips the next."""
        for hook in self._hooks:
            try:
                async with asyncio.timeout(self._hook_bound_s):
                    await hook(finished)
            except Exception:
                log.exception("run %s: completion hook %s failed", finished.run_id, getattr(hook, "__name__", hook))

    async def _end_lost(self, claimed: RunRecord, lost: RunRecord, journal: Journal) -> RunRecord:
        reasons, usage = await history_of(self._journal_store, claimed.run_id)
        await continue_stream(self._bridge, claimed, self._retention)
        control = claimed.control
        status = RunStatus.error
        error: str | None = (f"WorkerLost: the worker {lost.owner} running attempt {lost.attempt} was lost "
                 "(its process died or its lease expired); the run was not resumed (on_worker_lost: fail)")
        new = []
        already = {e.get("code") for e in reasons}
        if control is not None and control.get("code") not in already:
            # The cancel was first and the dead owner never recorded carrying it out.
            new.append(StopReason(
                code=str(control.get("code") or "cancelled"), source=str(control.get("source") or "manager"),
                seq=journal.next_seq(), detail=f"{control.get('detail') or ''} (completed by recovery)".strip(),
                data={"action": control.get("action")},
            ))
        new.append(StopReason(
            code="worker_lost", source="worker", seq=journal.next_seq(),
            detail=f"worker {lost.owner} stopped renewing the lease of attempt {lost.attempt}",
            data={"lost_owner": lost.owner, "lost_attempt": lost.attempt, "recovered_by": self._owner},
        ))
        if control is not None:
            status, error = RunStatus.interrupted, None
        for entry in new:
            data = entry.to_dict()
            journal.record("stop_reason", data, caller="worker", seq=data["seq"])
            reasons.append(data)
            await self._bridge.publish(claimed.run_id, "stop_reason", data,  # a fault only degrades it
                                       coordinate=journal.coordinate())
        completion = Completion(status, reasons, usage.as_dict(), error, acknowledges_control=True)
        await journal.flush()
        end = journal.unbuffered("run.end", {"status": status.value, "error": error, "usage": usage.as_dict(),
                                             "recovered": True, "attempt": claimed.attempt,
                                             "stream_seq": self._bridge.last_seq(claimed.run_id)}, caller="worker")
        finished = await self._store.finish(
            claimed.run_id, claimed.attempt, completion, end, AFTER_RUN.get(status, "idle"),
        )
        await journal.close()
        # After the durable record: an observer that misses END ends from the record.
        await self._bridge.publish_end(claimed.run_id)
        await self._on_freed(finished.thread_id)
        return finished


__all__ = ["Recovery", "continue_stream", "history_of", "owner_is_dead"]
