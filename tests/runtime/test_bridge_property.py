"""Property: for any retention, history length and cursor, replay is exactly the model's answer.

The model. After ``published`` events with retention ``R`` the retained seqs are
``first..published`` with ``first = max(1, published - R + 1)``. A cursor ``c`` (the seq to resume
after) beyond the last event receives only a ``cursor_ahead`` error (at ``published``); otherwise:

* one ``gap`` ``{requested_after: c, resumed_at: first, missed: first - c - 1}`` iff
  ``c < first - 1`` (some event after the cursor is no longer retained), then
* every retained seq greater than ``c``, in order, each exactly once, then
* END, whose ``seq`` (the subscriber's final position) is ``published``.

The same model covers a subscriber that read up to ``c`` and was then overtaken by trimming.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkeel.runtime.bridge import EventKind, StreamBridge, StreamEvent, open_bridge

Observed = list[tuple[str, Any]]


def model(retention: int, published: int, cursor: int) -> Observed:
    if cursor > published:
        return [("error", published)]
    after = cursor
    first = max(1, published - retention + 1)
    out: Observed = []
    if published and after < first - 1:
        gap = {"requested_after": after, "resumed_at": first, "missed": first - after - 1}
        out.append(("gap", gap))
    out.extend(("data", seq) for seq in range(max(after, first - 1) + 1, published + 1))
    out.append(("end", published))
    return out


def observe(items: list[StreamEvent]) -> Observed:
    out: Observed = []
    for item in items:
        if item.kind is EventKind.gap:
            out.append(("gap", item.data))
        elif item.kind is EventKind.data:
            assert item.data == {"seq": item.seq}, "payload must belong to its seq"
            out.append(("data", item.seq))
        elif item.kind in (EventKind.end, EventKind.error):
            out.append((item.kind.value, item.seq))
    return out


async def _rest(items: Any) -> list[StreamEvent]:
    rest = [item async for item in items if item.kind is not EventKind.heartbeat]
    assert rest[-1].kind in (EventKind.end, EventKind.error)
    return rest


async def _publish(bridge: StreamBridge, run_id: str, start: int, count: int) -> None:
    for seq in range(start, start + count):
        await bridge.publish(run_id, "values", {"seq": seq})


async def reconnect_case(
    url: str, retention: int, published: int, cursor_id: str | None
) -> Observed:
    """A client reconnecting with ``cursor_id`` after the run ended."""
    bridge = open_bridge(url, retention=retention, ttl_s=30, heartbeat_s=0.05, prefix=_prefix())
    try:
        await _publish(bridge, "r", 1, published)
        await bridge.publish_end("r")
        async with (
            asyncio.timeout(5),
            aclosing(bridge.subscribe("r", last_event_id=cursor_id)) as it,
        ):
            return observe(await _rest(it))
    finally:
        await bridge.delete("r")
        await bridge.close()


async def overtaken_case(url: str, retention: int, read: int, after: int) -> Observed:
    """A live subscriber that read events 1..``read`` as they came, then missed ``after`` more."""
    bridge = open_bridge(url, retention=retention, ttl_s=30, heartbeat_s=0.05, prefix=_prefix())
    try:
        async with asyncio.timeout(5), aclosing(bridge.subscribe("r")) as it:
            for seq in range(1, read + 1):
                await _publish(bridge, "r", seq, 1)
                assert (await anext(it)).seq == seq
            await _publish(bridge, "r", read + 1, after)
            await bridge.publish_end("r")
            return observe(await _rest(it))
    finally:
        await bridge.delete("r")
        await bridge.close()


def _prefix() -> str:
    return f"keeltest:{uuid.uuid4().hex[:10]}"


retentions = st.integers(1, 8)


overtaken_params = st.tuples(retentions, st.integers(1, 10), st.integers(0, 20))


def check_reconnect(
    url: str, retention: int, published: int, cursor: int | None, bare: bool
) -> None:
    cursor_id = None if cursor is None else (str(cursor) if bare else f"{cursor}-0")
    got = asyncio.run(reconnect_case(url, retention, published, cursor_id))
    assert got == model(retention, published, cursor or 0)


def check_overtaken(url: str, params: tuple[int, int, int]) -> None:
    retention, read, after = params
    got = asyncio.run(overtaken_case(url, retention, read, after))
    assert got == model(retention, read + after, read)


cursors = st.one_of(st.none(), st.integers(0, 25))


@settings(max_examples=120, deadline=None)
@given(retentions, st.integers(0, 20), cursors, st.booleans())
def test_reconnect_matches_model_memory(
    retention: int, published: int, cursor: int | None, bare: bool
) -> None:
    check_reconnect("memory", retention, published, cursor, bare)


@settings(max_examples=100, deadline=None)
@given(overtaken_params)
def test_overtaken_subscriber_matches_model_memory(params: tuple[int, int, int]) -> None:
    check_overtaken("memory", params)


@pytest.mark.redis
@settings(max_examples=30, deadline=None)
@given(retentions, st.integers(0, 20), cursors, st.booleans())
def test_reconnect_matches_model_redis(
    redis_url: str, retention: int, published: int, cursor: int | None, bare: bool
) -> None:
    check_reconnect(redis_url, retention, published, cursor, bare)


@pytest.mark.redis
@settings(max_examples=20, deadline=None)
@given(overtaken_params)
def test_overtaken_subscriber_matches_model_redis(
    redis_url: str, params: tuple[int, int, int]
) -> None:
    check_overtaken(redis_url, params)
