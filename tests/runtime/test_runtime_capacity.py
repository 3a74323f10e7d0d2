"""A worker's capacity (``limits.worker_max_runs``) holds for runs claimed by their admission too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from runtime_support import (
    DATABASE_MATRIX,
    FAST,
    SLOW,
    Keel,
    backend_matrix,
    finished,
    new_thread_id,
    start,
    stored,
    thread_status,
    wait_until,
)

from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.stores.memory import MemoryRunStore
from agentkeel.runtime.stores.sql import SqlRunStore

pytestmark = backend_matrix(DATABASE_MATRIX)


async def test_a_full_worker_admits_a_run_pending_and_starts_it_when_a_place_frees(keel: Keel) -> None:
    async with keel.open(keel.config({"slow": SLOW, "fast": FAST}, limits={"worker_max_runs": 1})) as rt:
        first = await start(rt, new_thread_id("cap-a"), "one", model_name="slow")
        # Startable and a place free: claimed by the admission itself, not left for the claim loop.
        assert first.status is RunStatus.running and first.owner == rt.manager.owner
        assert await thread_status(rt, first.thread_id) == "busy"
        second = await start(rt, new_thread_id("cap-b"), "two", model_name="fast")
        assert second.status is RunStatus.pending and second.owner is None  # no place: left pending
        await asyncio.sleep(0.3)  # the claim loop's turns: still no place
        assert (await stored(rt, second.run_id)).status is RunStatus.pending
        assert rt.manager.in_flight == 1
        assert await rt.manager.cancel(first.run_id) == "cancelled"
        assert (await finished(rt, first.run_id)).status is RunStatus.interrupted
        assert (await finished(rt, second.run_id)).status is RunStatus.success  # the freed place


async def test_an_admission_right_after_start_finds_the_claim_loops_start_up_pass_over(
    keel: Keel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening returns once the claim loop has looked at the queue: a slow start-up pass (here
    0.3 s) does not hold the only place when the first admission comes, so that run is claimed
    by its admission."""
    for store in (SqlRunStore, MemoryRunStore):
        claim_next = store.claim_next

        async def slow(self: Any, *args: Any, _claim_next: Any = claim_next, **kwargs: Any) -> RunRecord | None:
            await asyncio.sleep(0.3)
            return await _claim_next(self, *args, **kwargs)  # type: ignore[no-any-return]

        monkeypatch.setattr(store, "claim_next", slow)
    async with keel.open(keel.config({"slow": SLOW}, limits={"worker_max_runs": 1})) as rt:
        first = await start(rt, new_thread_id("cap-start"), "one", model_name="slow")
        assert first.status is RunStatus.running and first.owner == rt.manager.owner
        assert await rt.manager.cancel(first.run_id) == "cancelled"
        assert (await finished(rt, first.run_id)).status is RunStatus.interrupted


async def test_admissions_at_once_never_exceed_the_capacity(keel: Keel) -> None:
    """Ten admissions at once, with the claim loop woken by the pending ones: two places taken,
    whichever claims took them, and no more while they run."""
    async with keel.open(keel.config({"slow": SLOW}, limits={"worker_max_runs": 2})) as rt:
        runs = await asyncio.gather(*(start(rt, new_thread_id(f"cap-{i}"), model_name="slow") for i in range(10)))
        try:
            assert sum(r.status is RunStatus.running for r in runs) <= 2
            await wait_until(lambda: rt.manager.in_flight == 2, what="two runs in flight")
            await asyncio.sleep(0.3)  # the claim loop's turns: still two
            assert rt.manager.in_flight == 2
            statuses = [(await stored(rt, r.run_id)).status for r in runs]
            assert statuses.count(RunStatus.running) == 2 and statuses.count(RunStatus.pending) == 8
        finally:
            for record in runs:  # a pending run ends at once; a running one when it sees the request
                await rt.manager.cancel(record.run_id)
        for record in runs:
            assert (await finished(rt, record.run_id)).status is RunStatus.interrupted
        assert rt.manager.in_flight == 0


async def test_a_claim_loop_mid_claim_holds_its_place_against_admissions(keel: Keel) -> None:
    """The claim loop holds a place while its claim is under way, so admissions at that moment
    see one place fewer: the capacity is never exceeded, whichever claims first."""
    async with keel.open(keel.config({"slow": SLOW}, limits={"worker_max_runs": 2})) as rt:
        store = rt.manager.store
        entered, release = asyncio.Event(), asyncio.Event()
        claim_next = store.claim_next

        async def gated(*args: Any, **kwargs: Any) -> Any:  # only the claim loop calls it now
            if not release.is_set():
                entered.set()
                await release.wait()
            return await claim_next(*args, **kwargs)

        store.claim_next = gated  # type: ignore[method-assign]
        delayed = await start(rt, new_thread_id("cap-later"), model_name="slow", after_seconds=0.2)
        admitted: list[RunRecord] = []
        try:
            await asyncio.wait_for(entered.wait(), 5)  # the loop is inside its claim, holding a place
            admitted = [await start(rt, new_thread_id(f"cap-now-{i}"), model_name="slow") for i in range(2)]
            assert [r.status for r in admitted] == [RunStatus.running, RunStatus.pending]
            release.set()
            await wait_until(lambda: rt.manager.in_flight == 2, what="the loop's claim to land")
            await asyncio.sleep(0.5)  # the delay has passed and the loop has had its turns: still two
            assert rt.manager.in_flight == 2
        finally:
            release.set()
            for record in (delayed, *admitted):
                await rt.manager.cancel(record.run_id)
        for record in (delayed, *admitted):
            assert (await finished(rt, record.run_id)).status is RunStatus.interrupted
