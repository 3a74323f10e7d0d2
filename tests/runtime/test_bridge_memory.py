"""Behaviour specific to the in-memory bridge: reaping, byte budgets, the END grace, placeholders,
isolation, the factory."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from agentkeel.runtime.bridge import (
    EventKind,
    MemoryStreamBridge,
    StreamGone,
    open_bridge,
)
from agentkeel.runtime.bridge.base import EVENT_OVERHEAD


def memory(ttl_s: float = 30.0) -> MemoryStreamBridge:
    bridge = open_bridge("memory", retention=10, ttl_s=ttl_s, heartbeat_s=0.05)
    assert isinstance(bridge, MemoryStreamBridge) and not bridge.cross_process
    return bridge


async def test_reap_removes_only_expired_streams() -> None:
    bridge = memory(ttl_s=0.3)
    await bridge.publish("old", "values", 1)
    await bridge.publish_end("ended")
    await asyncio.sleep(0.2)
    await bridge.publish("fresh", "values", 1)  # its lazy reap finds nothing expired yet
    await asyncio.sleep(0.15)
    assert await bridge.reap() == 2
    assert await bridge.exists("fresh")
    assert not await bridge.exists("old") and not await bridge.exists("ended")


async def test_publish_restarts_ttl() -> None:
    bridge = memory(ttl_s=0.2)
    for _ in range(4):
        await bridge.publish("r", "values", 1)
        await asyncio.sleep(0.1)
    assert await bridge.exists("r")


async def test_placeholder_leaves_with_its_last_subscriber() -> None:
    bridge = memory()
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).kind is EventKind.heartbeat
        assert "r" in bridge._waiting
    assert not bridge._waiting and not await bridge.exists("r")


async def test_close_fails_every_subscriber() -> None:
    bridge = memory()
    await bridge.publish("a", "values", 1)
    followers = [bridge.subscribe("a"), bridge.subscribe("never-published")]
    assert (await anext(followers[0])).seq == 1
    assert (await anext(followers[1])).kind is EventKind.heartbeat
    await bridge.close()
    for items in followers:
        with pytest.raises(StreamGone):
            await asyncio.wait_for(anext(items), 1)


async def test_published_data_is_a_snapshot() -> None:
    bridge = memory()
    payload = {"messages": ["hi"]}
    await bridge.publish("r", "values", payload)
    payload["messages"].append("changed later")
    await bridge.publish_end("r")
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).data == {"messages": ["hi"]}


def test_factory_rejects_unknown_urls_and_bad_settings() -> None:
    with pytest.raises(ValueError):
        open_bridge("kafka://x", retention=1, ttl_s=1, heartbeat_s=1)
    for retention, ttl_s, heartbeat_s in ((0, 1.0, 1.0), (1, 0.0, 1.0), (1, 1.0, -1.0)):
        with pytest.raises(ValueError):
            open_bridge("memory", retention=retention, ttl_s=ttl_s, heartbeat_s=heartbeat_s)
    with pytest.raises(ValueError):
        memory().subscribe("r", heartbeat_s=0)


def budgeted(run_max_bytes: int | None = None, max_bytes: int | None = None, **kwargs: float) -> MemoryStreamBridge:
    bridge = open_bridge("memory", retention=1000, ttl_s=30, heartbeat_s=0.05,
                         run_max_bytes=run_max_bytes, max_bytes=max_bytes, **kwargs)
    assert isinstance(bridge, MemoryStreamBridge)
    return bridge


async def read_all(bridge: MemoryStreamBridge, run_id: str) -> list[tuple[EventKind, object]]:
    async with aclosing(bridge.subscribe(run_id, last_event_id="-1")) as items:
        return [(item.kind, item.data) async for item in items if item.kind is not EventKind.heartbeat]


async def test_a_run_over_its_byte_budget_drops_its_oldest_events_with_a_gap() -> None:
    bridge = budgeted(run_max_bytes=4 * (1000 + EVENT_OVERHEAD + len("values")))
    for i in range(10):
        await bridge.publish("r", "values", {"i": i, "pad": "x" * 980})
    await bridge.publish_end("r")
    assert bridge.nbytes <= bridge.run_max_bytes  # type: ignore[operator]
    got = await read_all(bridge, "r")
    assert got[0] == (EventKind.gap, {"requested_after": 0, "resumed_at": got[1][1]["i"] + 1,  # type: ignore[index]
                                      "missed": got[1][1]["i"]})  # type: ignore[index]
    kept = [data["i"] for kind, data in got if kind is EventKind.data]  # type: ignore[index]
    assert kept == list(range(10 - len(kept), 10)) and 2 <= len(kept) <= 4  # the newest, in order
    assert got[-1][0] is EventKind.end


async def test_a_process_over_its_byte_budget_drops_finished_streams_first_then_the_oldest_history() -> None:
    event = 1000 + EVENT_OVERHEAD + len("values")
    bridge = budgeted(max_bytes=6 * event)
    for run_id in ("done", "idle", "busy"):
        await bridge.publish(run_id, "values", {"pad": "x" * 990})
        await bridge.publish(run_id, "values", {"pad": "y" * 990})
    await bridge.publish_end("done")
    assert await bridge.exists("done")
    await bridge.publish("busy", "values", {"pad": "z" * 990})  # one event over the budget
    assert not await bridge.exists("done")  # the finished stream went whole, live ones kept all
    assert await bridge.final_seq("done") == 2
    assert [k for k, _ in await read_all_live(bridge, "idle")] == [EventKind.data, EventKind.data]
    for _ in range(3):
        await bridge.publish("busy", "values", {"pad": "w" * 990})
    assert bridge.nbytes <= 6 * event
    idle = await read_all_live(bridge, "idle")
    assert [k for k, _ in idle] == [EventKind.gap, EventKind.data]  # the least recently written first
    assert idle[0][1] == {"requested_after": 0, "resumed_at": 2, "missed": 1}


async def read_all_live(bridge: MemoryStreamBridge, run_id: str) -> list[tuple[EventKind, object]]:
    """What a subscriber from the start reads of a live stream before its first heartbeat."""
    got = []
    async with aclosing(bridge.subscribe(run_id, last_event_id="-1")) as items:
        async for item in items:
            if item.kind is EventKind.heartbeat:
                break
            got.append((item.kind, item.data))
    return got


async def test_an_ended_stream_is_dropped_after_its_grace_and_leaves_its_last_seq() -> None:
    bridge = budgeted(end_grace_s=0.1)
    for i in range(3):
        await bridge.publish("r", "values", i)
    await bridge.publish("live", "values", 1)
    await bridge.publish_end("r")
    await asyncio.sleep(0.15)
    assert await bridge.reap() == 1
    assert not await bridge.exists("r") and await bridge.exists("live")  # a live stream keeps its ttl_s
    assert await bridge.final_seq("r") == 3 and bridge.nbytes > 0
    await bridge.delete("live")
    assert bridge.nbytes == 0
