"""The lease keeper on its own: deadlines, control requests, and a loop that outlives failures."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from agentkeel.runtime.active import ActiveRun
from agentkeel.runtime.leases import LeaseKeeper
from agentkeel.runtime.records import RunRecord, RunStatus, new_run_id
from agentkeel.runtime.stores.memory import MemoryRunStore


async def _owned(store: MemoryRunStore, owner: str) -> RunRecord:
    await store.admit(RunRecord(run_id=new_run_id(), thread_id=f"t-{new_run_id()[:8]}", assistant_id="lead"))
    claimed = await store.claim_next(owner, datetime.now(UTC) + timedelta(seconds=5), datetime.now(UTC))
    assert claimed is not None and claimed.status is RunStatus.running
    return claimed


def _active(record: RunRecord, keeper: LeaseKeeper) -> ActiveRun:
    active = ActiveRun(record, prepared=None)  # type: ignore[arg-type]  # the keeper never reads it
    keeper.start_lease(active, time.monotonic())
    return active


async def test_renewal_carries_a_stored_control_request_to_the_owner() -> None:
    store = MemoryRunStore()
    record = await _owned(store, "w1")
    runs: dict[str, ActiveRun] = {}
    keeper = LeaseKeeper(store, "w1", 3.0, runs, lambda _run_id: 5)
    active = runs[record.run_id] = _active(record, keeper)
    control = {"action": "interrupt", "code": "cancelled", "source": "gateway", "detail": "stop"}
    await store.request_control(record.run_id, control)
    await keeper.renew_all()
    assert active.abort is not None and active.abort.from_control and active.abort.code == "cancelled"
    assert not active.fenced
    assert (await store.get(record.run_id)).stream_seq == 5  # type: ignore[union-attr]


async def test_a_superseded_owner_fences_itself() -> None:
    store = MemoryRunStore()
    record = await _owned(store, "w1")
    runs: dict[str, ActiveRun] = {}
    keeper = LeaseKeeper(store, "w1", 3.0, runs, lambda _run_id: None)
    active = runs[record.run_id] = _active(record, keeper)
    await store.claim(record.run_id, "w2", datetime.now(UTC) + timedelta(seconds=30), attempt=1)
    await keeper.renew_all()
    assert active.fenced and active.abort is not None and active.abort.code == "lease_lost"


async def test_the_renewal_loop_outlives_a_failing_store() -> None:
    """A failure the renewal itself does not handle (here: reading the record back after a lease
    was not renewed) must not end the loop: it is what checks every run's deadline."""
    store = MemoryRunStore()
    record = await _owned(store, "w1")
    runs: dict[str, ActiveRun] = {}
    keeper = LeaseKeeper(store, "w1", 3.0, runs, lambda _run_id: None)
    active = runs[record.run_id] = _active(record, keeper)
    calls = 0

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {record.run_id: None}  # "not renewed": the keeper then reads the record
        return await MemoryRunStore.renew_leases(store, *args, **kwargs)

    async def unreadable(_run_id: str) -> Any:
        raise RuntimeError("the store is unreachable")

    store.renew_leases = flaky  # type: ignore[method-assign]
    store.get = unreadable  # type: ignore[method-assign]
    loop = asyncio.create_task(keeper.run_forever())
    try:
        await asyncio.sleep(keeper.interval_s * 2.5)
    finally:
        loop.cancel()
    assert calls >= 2 and not active.fenced  # renewed again after the failure, lease kept
