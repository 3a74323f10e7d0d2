"""Stream faults during real runs (driven through the runtime's worker) on a private Redis.

Whatever happens to the stream - its key deleted mid-run, Redis restarted without persistence,
END lost - the run ends ``success`` and a subscriber sees replay or an explicit ``gap``, never an
event id twice, and always an end. The shared Redis is never touched: each test starts its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from runtime_support import (
    Keel,
    call,
    finished,
    new_thread_id,
    start,
    stream_events,
    turn,
    wait_until,
)

from agentkeel.runtime.bridge import EventKind, StreamEvent, TooManySubscribers
from agentkeel.runtime.observe import RUN_RECORD_EVENT
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.runtime import Runtime
from private_redis import PrivateRedis, private_redis  # noqa: F401 (the fixture)

# About 2 s of steady events (one or two per turn): every turn lists the workspace after a short think.
STEADY = [turn(f"Step {n}.", call("ls", path="/workspace"), delay_ms=250) for n in range(16)] + [turn("Done.")]


def check_honest(items: list[StreamEvent]) -> list[int]:
    """The invariants every subscriber must see; returns the data seqs."""
    assert items and items[-1].kind is EventKind.end, "a subscriber always ends"
    data = [i for i in items if i.kind is EventKind.data and i.event != RUN_RECORD_EVENT]
    ids = [i.id for i in data]
    assert len(ids) == len(set(ids)), f"an event id was delivered twice: {ids}"
    seqs = [i.seq for i in data]
    assert seqs == sorted(seqs), "seqs only go forward"
    position = 0
    for item in items:  # every jump forward is announced by a gap
        if item.kind is EventKind.gap:
            assert item.data["requested_after"] == position
            position = item.seq
        elif item.kind is EventKind.data and item.event != RUN_RECORD_EVENT:
            assert item.seq == position + 1, f"silently skipped from {position} to {item.seq}"
            position = item.seq
    return seqs


@dataclass
class Outcome:
    record: RunRecord
    live: list[StreamEvent]  # what a subscriber following from the start saw
    replay: list[StreamEvent]  # a replay from the start after the run ended
    faulted_at: int  # the publisher's last seq when the fault was injected
    publish_failures: int


async def steady_run_with(
    keel: Keel, redis: PrivateRedis, fault: Callable[[Runtime, str], Awaitable[None]]
) -> Outcome:
    """Run STEADY through the worker, followed from the start; inject ``fault`` after 3 events."""
    config = keel.config({"steady": STEADY}, stream=redis.url)
    async with keel.open(config) as rt:
        run = await start(rt, new_thread_id("faults"), "go")
        follower = asyncio.ensure_future(stream_events(rt, run.run_id, "-1", timeout=30))
        await wait_until(lambda: (rt.bridge.last_seq(run.run_id) or 0) >= 3, what="a few events")
        faulted_at = rt.bridge.last_seq(run.run_id) or 0
        await fault(rt, run.run_id)
        record = await finished(rt, run.run_id, timeout=30)
        live = await follower
        replay = await stream_events(rt, run.run_id, "-1")
        return Outcome(record, live, replay, faulted_at, rt.bridge.publish_failures)


async def test_stream_key_deleted_mid_run(keel: Keel, private_redis: PrivateRedis) -> None:  # noqa: F811
    async def delete_key(rt: Runtime, run_id: str) -> None:
        assert await rt.bridge.exists(run_id)
        await rt.bridge.delete(run_id)

    outcome = await steady_run_with(keel, private_redis, delete_key)
    assert outcome.record.status is RunStatus.success
    check_honest(outcome.live)
    seqs = check_honest(outcome.replay)
    assert seqs[0] > outcome.faulted_at, "ids continue after the lost key"
    assert outcome.replay[0].kind is EventKind.gap and outcome.replay[0].data["requested_after"] == 0
    assert outcome.publish_failures == 0


async def test_redis_restarted_mid_stream(keel: Keel, private_redis: PrivateRedis) -> None:  # noqa: F811
    async def restart(rt: Runtime, run_id: str) -> None:
        private_redis.kill()
        await wait_until(lambda: rt.bridge.publish_failures > 0, what="a publish to fail")
        await asyncio.sleep(0.3)
        private_redis.start()  # same port, empty: every key is gone

    outcome = await steady_run_with(keel, private_redis, restart)
    assert outcome.record.status is RunStatus.success, outcome.record.error
    check_honest(outcome.live)
    told = any(i.kind is EventKind.gap or i.event == RUN_RECORD_EVENT for i in outcome.live)
    assert told, "the subscriber must learn that it missed events"
    check_honest(outcome.replay)


async def test_redis_down_when_end_is_published(keel: Keel, private_redis: PrivateRedis) -> None:  # noqa: F811
    """The run finishes while Redis is down, so END is lost: followers (and later replays) end
    from the run record instead of heart-beating forever."""
    async def stay_down(rt: Runtime, run_id: str) -> None:
        private_redis.kill()

    outcome = await steady_run_with(keel, private_redis, stay_down)
    assert outcome.record.status is RunStatus.success, outcome.record.error
    assert outcome.publish_failures > 0
    for items in (outcome.live, outcome.replay):
        check_honest(items)
        assert items[-2].event == RUN_RECORD_EVENT and items[-2].data["status"] == "success"


async def test_end_never_published_ends_from_the_record_within_a_heartbeat(
    keel: Keel, private_redis: PrivateRedis  # noqa: F811
) -> None:
    config = keel.config(stream=private_redis.url)
    async with keel.open(config) as rt:
        run = await start(rt, new_thread_id("noend"), "hi")
        await finished(rt, run.run_id)
        # The stream as a lost END leaves it: events, no END.
        await rt.bridge.delete(run.run_id)
        for n in range(3):
            await rt.bridge.publish(run.run_id, "values", {"n": n})
        heartbeat = config.limits.stream_heartbeat_s
        begin = time.monotonic()
        items = await stream_events(rt, run.run_id, "-1", timeout=10)
        took = time.monotonic() - begin
    assert [i.event for i in items if i.kind is EventKind.data][-1] == RUN_RECORD_EVENT
    assert items[-1].kind is EventKind.end
    assert took < 2 * heartbeat + 0.5, f"took {took:.2f} s with a {heartbeat} s heartbeat"


@pytest.mark.parametrize("keel_backend", [("memory", "memory")], indirect=True)
async def test_end_never_published_on_the_memory_bridge(keel: Keel) -> None:
    async with keel.open(keel.config()) as rt:
        run = await start(rt, new_thread_id("noend-mem"), "hi")
        await finished(rt, run.run_id)
        await rt.bridge.delete(run.run_id)
        for n in range(2):
            await rt.bridge.publish(run.run_id, "values", {"n": n})
        follower = asyncio.ensure_future(stream_events(rt, run.run_id, "-1", timeout=10))
        items = await follower
    kinds = [(i.kind, i.event) for i in items]
    assert kinds[-2:] == [(EventKind.data, RUN_RECORD_EVENT), (EventKind.end, "__end__")]
    assert items[-2].data["status"] == "success"
    assert [i.data for i in items if i.event == "values"][-2:] == [{"n": 0}, {"n": 1}]


async def test_publishes_survive_many_idle_subscribers(keel: Keel, private_redis: PrivateRedis) -> None:  # noqa: F811
    """Idle subscribers have their own pool: 120 of them never make a publish (or a run) fail."""
    config = keel.config(stream=private_redis.url, limits={"stream_max_subscribers": 121})
    async with keel.open(config) as rt:
        idle = [rt.bridge.subscribe(f"idle-{n}") for n in range(120)]
        try:
            await asyncio.gather(*(anext(s) for s in idle))
            assert rt.bridge.subscribers == 120
            run = await start(rt, new_thread_id("crowd"), "hi")
            record = await finished(rt, run.run_id)
            assert record.status is RunStatus.success
            assert rt.bridge.publish_failures == 0
            assert check_honest(await stream_events(rt, run.run_id, "-1"))
            idle.append(rt.bridge.subscribe("one-more"))
            await anext(idle[-1])
            with pytest.raises(TooManySubscribers):  # the gateway answers 503 for this one
                rt.bridge.subscribe(run.run_id)
        finally:
            await asyncio.gather(*(s.aclose() for s in idle))
