"""A worker's capacity (``limits.worker_max_runs``) holds for runs claimed by their admission too."""

from __future__ import annotations

import asyncio

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
)

from agentkeel.runtime.records import RunStatus

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


async def test_admissions_at_once_never_exceed_the_capacity(keel: Keel) -> None:
    """Places are held from the admission's claim to the launch, so ten admissions that all see
    one free place do not all take it."""
    async with keel.open(keel.config({"slow": SLOW}, limits={"worker_max_runs": 2})) as rt:
        runs = await asyncio.gather(*(start(rt, new_thread_id(f"cap-{i}"), model_name="slow") for i in range(10)))
        assert sorted(r.status.value for r in runs) == ["pending"] * 8 + ["running"] * 2
        assert rt.manager.in_flight == 2
        for record in runs:  # a pending run ends at once; a running one when it sees the request
            assert await rt.manager.cancel(record.run_id) == "cancelled"
        for record in runs:
            assert (await finished(rt, record.run_id)).status is RunStatus.interrupted
        assert rt.manager.in_flight == 0
