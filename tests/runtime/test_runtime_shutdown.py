"""Shutting the runtime down with runs in flight, and what the manager keeps in memory."""

from __future__ import annotations

import time

import pytest
from runtime_support import (
    FAST,
    LIGHT_MATRIX,
    NO_RETRY,
    SLOW,
    Keel,
    backend_matrix,
    data_events,
    new_thread_id,
    run_to_end,
    start,
    stored,
    stream_events,
    turn,
    wait_status,
)

from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.manager import ShuttingDown
from agentkeel.runtime.records import MultitaskStrategy, RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)


async def test_shutdown_interrupts_runs_that_outlast_the_drain(keel: Keel) -> None:
    config = keel.config({"slow": SLOW, "fast": FAST})
    async with keel.open(config) as rt:
        thread = new_thread_id("shutdown")
        running = await start(rt, thread, "slow one")
        queued = await start(rt, thread, "queued", model_name="fast", multitask_strategy=MultitaskStrategy.enqueue)
        await wait_status(rt, running.run_id, RunStatus.running)

        began = time.monotonic()
        await rt.manager.shutdown(drain_s=0.2)
        assert time.monotonic() - began < 3.0
        assert rt.manager.in_flight == 0

        record = await stored(rt, running.run_id)
        assert record.status == RunStatus.interrupted
        assert record.stop_reason == "cancelled"
        assert record.stop_reasons[0]["source"] == "worker"
        assert "shut down" in record.stop_reasons[0]["detail"]
        # The queued run is not this process's to end: it stays admitted, for the next worker.
        waiting = await stored(rt, queued.run_id)
        assert waiting.status == RunStatus.pending and waiting.started_at is None
        items = await stream_events(rt, running.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["cancelled"]

        with pytest.raises(ShuttingDown):
            await start(rt, new_thread_id("late"), "too late")
        assert await rt.store.list_runs(thread_id=thread) != []
        assert len(await rt.store.list_runs(thread_id=thread)) == 2


async def test_shutdown_lets_a_run_finish_within_the_drain(keel: Keel) -> None:
    async with keel.open(keel.config({"brief": [turn("Made it.", delay_ms=150)]})) as rt:
        run = await start(rt, new_thread_id("drain"), "hi")
        await wait_status(rt, run.run_id, RunStatus.running)
        await rt.manager.shutdown(drain_s=5.0)
        record = await stored(rt, run.run_id)
        assert record.status == RunStatus.success and record.stop_reasons == []


async def test_bookkeeping_is_bounded_by_what_is_in_flight(keel: Keel) -> None:
    config = keel.config({
        "fast": FAST,
        "broken": [{"raise": {"kind": "server_error", "message": "boom"}}],
    }, limits=NO_RETRY)
    async with keel.open(config) as rt:
        threads = [new_thread_id("many"), new_thread_id("many")]
        records = []
        for i in range(30):
            model = "broken" if i % 10 == 9 else "fast"
            records.append(await run_to_end(rt, threads[i % 2], f"run {i}", model_name=model))
            assert rt.manager.in_flight == 0
        statuses = [r.status for r in records]
        assert statuses.count(RunStatus.error) == 3 and statuses.count(RunStatus.success) == 27
        assert all(rt.manager.active(r.run_id) is None for r in records)
        for thread in threads:
            assert len(await rt.store.list_runs(thread_id=thread)) == 15
            assert await rt.store.active_runs(thread) == []
