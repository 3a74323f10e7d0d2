"""Behaviour specific to the Redis Streams bridge: key layout, TTL, many processes, retries."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from agentkeel.runtime.bridge import EventKind, StreamClosed, open_bridge
from agentkeel.runtime.bridge.redis import READ_RETRIES, RedisStreamBridge

pytestmark = pytest.mark.redis


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    yield redis
    await redis.aclose()


def redis_bridge(client: Redis, prefix: str, **overrides: Any) -> RedisStreamBridge:
    settings: dict[str, Any] = {"retention": 3, "ttl_s": 5.0, "heartbeat_s": 0.05}
    return RedisStreamBridge(client, prefix=prefix, **(settings | overrides))


async def test_factory_builds_a_cross_process_bridge(redis_url: str, redis_prefix: str) -> None:
    bridge = open_bridge(redis_url, retention=3, ttl_s=5, heartbeat_s=1, prefix=redis_prefix)
    assert isinstance(bridge, RedisStreamBridge) and bridge.cross_process
    assert await bridge.publish("r", "values", None)
    assert await bridge.exists("r")
    await bridge.delete("r")
    assert bridge.key("r") == f"{redis_prefix}:stream:r"
    await bridge.close()


async def test_one_key_trimmed_to_retention_plus_end_with_ttl(
    client: Redis, redis_prefix: str
) -> None:
    bridge = redis_bridge(client, redis_prefix)
    key = bridge.key("r")
    try:
        for i in range(10):
            await bridge.publish("r", "values", i)
        await bridge.publish_end("r")
        assert await client.keys(f"{redis_prefix}:*") == [key]
        assert await client.xlen(key) == 4
        assert 0 < await client.pttl(key) <= 5000
        entries: Any = await client.xrange(key)
        assert [entry_id for entry_id, _ in entries] == ["8-0", "9-0", "10-0", "10-1"]
    finally:
        await bridge.delete("r")


async def test_publishers_in_different_processes_share_one_sequence(
    redis_url: str, redis_prefix: str
) -> None:
    bridges = [
        open_bridge(redis_url, retention=500, ttl_s=5, heartbeat_s=0.05, prefix=redis_prefix)
        for _ in range(3)
    ]

    async def publish(bridge_index: int) -> list[int]:
        bridge = bridges[bridge_index]
        return [(await bridge.publish("r", "values", n)).seq for n in range(40)]

    try:
        got = await asyncio.gather(*(publish(i) for i in range(3)))
        assert sorted(seq for seqs in got for seq in seqs) == list(range(1, 121))
        assert all(seqs == sorted(seqs) for seqs in got)
        await bridges[0].publish_end("r")
        with pytest.raises(StreamClosed):
            await bridges[1].publish("r", "values", None)
        async with asyncio.timeout(5), aclosing(bridges[2].subscribe("r")) as items:
            assert [item.seq async for item in items][:-1] == list(range(1, 121))
    finally:
        await bridges[0].delete("r")
        for bridge in bridges:
            await bridge.close()


async def test_transient_read_errors_are_retried(
    client: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge = redis_bridge(client, redis_prefix)
    await bridge.publish("r", "values", 1)
    real_xread = client.xread
    failures = iter(range(READ_RETRIES))

    async def flaky_xread(*args: Any, **kwargs: Any) -> Any:
        if next(failures, None) is not None:
            raise RedisConnectionError("connection reset")
        return await real_xread(*args, **kwargs)

    monkeypatch.setattr(client, "xread", flaky_xread)
    async with asyncio.timeout(5), aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).seq == 1
    await bridge.delete("r")


async def test_persistent_read_errors_become_heartbeats_after_bounded_retries(
    client: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber outlives a Redis outage: each failed read is retried a bounded number of
    times, then reported as a heartbeat (so its observer can consult the run record)."""
    bridge = redis_bridge(client, redis_prefix)
    calls = 0

    async def broken_xread(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise RedisConnectionError("connection refused")

    monkeypatch.setattr(client, "xread", broken_xread)
    async with asyncio.timeout(5), aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).kind is EventKind.heartbeat
    assert calls == READ_RETRIES + 1


async def test_the_configured_stream_prefix_namespaces_a_runtime_keys(
    redis_url: str, redis_prefix: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentkeel.config import KeelConfig
    from agentkeel.runtime.checkpoints import mode as mode_module
    from agentkeel.runtime.runtime import open_runtime

    monkeypatch.setattr(mode_module, "_frozen", None)
    config = KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://", stream=redis_url,
        stream_prefix=redis_prefix, base_dir=tmp_path,
    )
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        async with open_runtime(config) as rt:
            await rt.bridge.publish("run-prefix", "custom", {"n": 1})
            assert await client.exists(f"{redis_prefix}:stream:run-prefix") == 1
            await rt.bridge.delete("run-prefix")
    finally:
        await client.aclose()


async def test_publishing_to_an_unreachable_redis_degrades_and_never_raises(redis_prefix: str) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    bridge = open_bridge(url, retention=10, ttl_s=5, heartbeat_s=0.05, prefix=redis_prefix)
    try:
        begin = time.monotonic()
        assert await bridge.publish("r", "values", 1) is None
        assert await bridge.publish("r", "values", 2) is None  # within the backoff: not even tried
        assert await bridge.publish_end("r") is False
        assert time.monotonic() - begin < 2.5
        assert bridge.publish_failures == 3
        assert bridge.last_seq("r") is None  # END (even a lost one) forgets the counter
        with pytest.raises(ValueError):  # caller bugs still raise
            await bridge.publish("r", "__end__", None)
    finally:
        begin = time.monotonic()
        await bridge.close()
        assert time.monotonic() - begin < 5


async def test_lost_publishes_skip_their_seqs(client: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bridge = redis_bridge(client, redis_prefix, retention=10)
    await bridge.publish("r", "values", 1)
    real = bridge._script

    async def lost(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("connection reset")

    monkeypatch.setattr(bridge, "_script", lost)
    assert await bridge.publish("r", "values", 2) is None
    assert bridge.last_seq("r") == 2
    monkeypatch.setattr(bridge, "_script", real)
    monkeypatch.setattr(bridge, "_faulted_until", 0.0)  # as if the backoff window had passed
    assert (await bridge.publish("r", "values", 3)).seq == 3
    await bridge.publish_end("r")
    async with asyncio.timeout(5), aclosing(bridge.subscribe("r")) as items:
        got = [(i.kind.value, i.seq) async for i in items]
    assert got == [("data", 1), ("gap", 2), ("data", 3), ("end", 3)]
    await bridge.delete("r")
