"""Behaviour specific to the in-memory bridge: reaping, placeholders, isolation, the factory."""

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
