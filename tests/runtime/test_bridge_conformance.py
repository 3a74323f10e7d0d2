"""The StreamBridge contract, run against every backend (memory and Redis Streams)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from agentkeel.runtime.bridge import (
    CURSOR_AHEAD_EVENT,
    END_EVENT,
    GAP_EVENT,
    HEARTBEAT_EVENT,
    LIVE,
    EventKind,
    InvalidEventId,
    StreamBridge,
    StreamClosed,
    StreamEvent,
    StreamGone,
    TooManySubscribers,
    open_bridge,
    parse_event_id,
)
from agentkeel.runtime.bridge.base import encode_data, entry_size
from agentkeel.runtime.bridge.redis import RedisStreamBridge

MakeBridge = Callable[..., StreamBridge]
HB = 0.05  # heartbeat interval used throughout: keeps idle waits short


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def make_bridge(
    request: pytest.FixtureRequest, redis_prefix: str
) -> AsyncIterator[MakeBridge]:
    """Builds bridges of the parametrised backend; closes them and deletes their Redis keys."""
    url = "memory" if request.param == "memory" else request.getfixturevalue("redis_url")
    made: list[StreamBridge] = []

    def make(
        *, retention: int = 100, ttl_s: float = 30.0, heartbeat_s: float = HB, max_subscribers: int | None = None,
        end_grace_s: float | None = None, run_max_bytes: int | None = None,
    ) -> StreamBridge:
        bridge = open_bridge(
            url, retention=retention, ttl_s=ttl_s, heartbeat_s=heartbeat_s, prefix=redis_prefix,
            max_subscribers=max_subscribers, end_grace_s=end_grace_s, run_max_bytes=run_max_bytes,
        )
        made.append(bridge)
        return bridge

    yield make
    for bridge in made:
        await bridge.close()
    if url != "memory":
        client = Redis.from_url(url, decode_responses=True)
        keys = [key async for key in client.scan_iter(match=f"{redis_prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
def bridge(make_bridge: MakeBridge) -> StreamBridge:
    return make_bridge()


async def drain(
    bridge: StreamBridge, run_id: str, last_event_id: str | None = None, timeout: float = 5.0
) -> list[StreamEvent]:
    """Everything but heartbeats, up to and including END."""
    out: list[StreamEvent] = []
    async with asyncio.timeout(timeout):
        async with aclosing(bridge.subscribe(run_id, last_event_id=last_event_id)) as items:
            async for item in items:
                if item.kind is not EventKind.heartbeat:
                    out.append(item)
    assert out and out[-1].kind is EventKind.end, "END must come last"
    return out


def seqs(items: list[StreamEvent]) -> list[int]:
    return [item.seq for item in items if item.kind is EventKind.data]


def gaps(items: list[StreamEvent]) -> list[dict[str, int]]:
    return [item.data for item in items if item.kind is EventKind.gap]


async def publish_n(bridge: StreamBridge, run_id: str, n: int) -> list[StreamEvent]:
    return [await bridge.publish(run_id, "values", {"i": i}) for i in range(n)]


async def test_ids_unique_increasing_and_parseable(bridge: StreamBridge) -> None:
    published = await publish_n(bridge, "r", 10)
    assert [e.seq for e in published] == list(range(1, 11))
    assert len({e.id for e in published}) == 10
    for event in published:
        assert re.fullmatch(r"[0-9]+-[0-9]+", event.id)  # a valid Redis stream id
        assert parse_event_id(event.id) == event.seq
        assert event.kind is EventKind.data


async def test_data_round_trips_as_json_on_every_backend(bridge: StreamBridge) -> None:
    when = datetime(2026, 1, 2, tzinfo=UTC)
    sent = await bridge.publish("r", "custom", {"t": (1, 2), "at": when, "s": "é"})
    await bridge.publish_end("r")
    expected = {"t": [1, 2], "at": str(when), "s": "é"}
    assert sent.data == expected
    assert (await drain(bridge, "r"))[0].data == expected


async def test_the_run_coordinate_travels_with_each_event_and_not_in_its_data(bridge: StreamBridge) -> None:
    at = {"run_id": "r", "attempt": 2, "step": 7, "journal_seq": 41}
    sent = await bridge.publish("r", "values", {"x": 1}, coordinate=at)
    await bridge.publish("r", "values", {"x": 2})
    await bridge.publish_end("r")
    stamped, plain, _end = await drain(bridge, "r")
    assert sent.coordinate == stamped.coordinate == at and stamped.data == {"x": 1}
    assert plain.coordinate is None and plain.data == {"x": 2}


async def test_reserved_event_names_are_refused(bridge: StreamBridge) -> None:
    for name in (END_EVENT, GAP_EVENT, HEARTBEAT_EVENT, CURSOR_AHEAD_EVENT, ""):
        with pytest.raises(ValueError):
            await bridge.publish("r", name, None)


async def test_replay_strictly_after_last_event_id(bridge: StreamBridge) -> None:
    published = await publish_n(bridge, "r", 5)
    await bridge.publish_end("r")
    assert seqs(await drain(bridge, "r", published[1].id)) == [3, 4, 5]
    assert seqs(await drain(bridge, "r", "4")) == [5]
    assert seqs(await drain(bridge, "r", published[-1].id)) == []


@pytest.mark.parametrize("start", [None, "-1", "-", "0-0", "0"])
async def test_start_aliases_replay_everything(bridge: StreamBridge, start: str | None) -> None:
    await publish_n(bridge, "r", 4)
    await bridge.publish_end("r")
    items = await drain(bridge, "r", start)
    assert seqs(items) == [1, 2, 3, 4] and not gaps(items)


async def test_live_only_sees_only_later_events(bridge: StreamBridge) -> None:
    await publish_n(bridge, "r", 3)
    async with aclosing(bridge.subscribe("r", last_event_id=LIVE)) as items:
        assert (await anext(items)).kind is EventKind.heartbeat  # joined, nothing new
        await publish_n(bridge, "r", 2)
        await bridge.publish_end("r")
        rest = [item async for item in items if item.kind is not EventKind.heartbeat]
    assert seqs(rest) == [4, 5] and rest[-1].kind is EventKind.end


async def test_live_only_on_ended_stream_ends_at_once(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(heartbeat_s=30)
    await publish_n(bridge, "r", 3)
    await bridge.publish_end("r")
    async with asyncio.timeout(1), aclosing(bridge.subscribe("r", last_event_id=LIVE)) as items:
        assert [item.event async for item in items] == [END_EVENT]


@pytest.mark.parametrize(
    "bad", ["", "abc", "1-1", "-2", " 1", "1-", "1-0-0", "1.5", "$$", "\u0661", "9" * 30, "0x1"]
)
async def test_malformed_id_raises_before_iterating(bridge: StreamBridge, bad: str) -> None:
    with pytest.raises(InvalidEventId):
        bridge.subscribe("r", last_event_id=bad)
    assert issubclass(InvalidEventId, ValueError)


async def test_cursor_older_than_retention_yields_one_gap(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(retention=5)
    await publish_n(bridge, "r", 12)
    await bridge.publish_end("r")
    items = await drain(bridge, "r", "3-0")
    assert items[0].kind is EventKind.gap and items[0].id == "" and items[0].event == GAP_EVENT
    assert gaps(items) == [{"requested_after": 3, "resumed_at": 8, "missed": 4}]
    assert seqs(items) == [8, 9, 10, 11, 12]
    from_start = await drain(bridge, "r")
    assert gaps(from_start) == [{"requested_after": 0, "resumed_at": 8, "missed": 7}]
    assert seqs(from_start) == [8, 9, 10, 11, 12]
    just_before = await drain(bridge, "r", "7")  # nothing missed: no gap
    assert not gaps(just_before) and seqs(just_before) == [8, 9, 10, 11, 12]


async def test_slow_subscriber_overtaken_by_trimming_gets_gap(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(retention=4)
    await publish_n(bridge, "r", 1)
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).seq == 1
        await publish_n(bridge, "r", 9)  # seqs 2..10; only 7..10 stay retained
        await bridge.publish_end("r")
        rest = [item async for item in items if item.kind is not EventKind.heartbeat]
    assert gaps(rest) == [{"requested_after": 1, "resumed_at": 7, "missed": 5}]
    assert rest[0].kind is EventKind.gap
    assert seqs(rest) == [7, 8, 9, 10] and rest[-1].kind is EventKind.end


async def test_end_is_last_and_late_subscribers_get_retained_then_end(
    make_bridge: MakeBridge,
) -> None:
    bridge = make_bridge(heartbeat_s=30)  # a late subscriber must not wait for a heartbeat
    early = asyncio.create_task(drain(bridge, "r"))
    await publish_n(bridge, "r", 3)
    await bridge.publish_end("r")
    await bridge.publish_end("r")  # idempotent
    for items in (await early, await drain(bridge, "r", timeout=1)):
        assert seqs(items) == [1, 2, 3]
        assert [item.kind for item in items].count(EventKind.end) == 1
        assert items[-1].event == END_EVENT and items[-1].id == "" and items[-1].seq == 3


async def test_end_on_unpublished_run(bridge: StreamBridge) -> None:
    await bridge.publish_end("r")
    assert await bridge.exists("r")
    assert [item.event for item in await drain(bridge, "r")] == [END_EVENT]


async def test_publish_after_end_raises(bridge: StreamBridge) -> None:
    await publish_n(bridge, "r", 2)
    await bridge.publish_end("r")
    with pytest.raises(StreamClosed):
        await bridge.publish("r", "values", {})
    assert seqs(await drain(bridge, "r")) == [1, 2]


async def test_heartbeat_when_idle(bridge: StreamBridge) -> None:
    await publish_n(bridge, "r", 1)
    async with aclosing(bridge.subscribe("r", heartbeat_s=HB)) as items:
        assert (await anext(items)).seq == 1
        for _ in range(3):
            started = time.monotonic()
            beat = await asyncio.wait_for(anext(items), 2)
            assert beat.kind is EventKind.heartbeat and beat.event == HEARTBEAT_EVENT
            assert beat.id == "" and beat.seq == 1
            assert time.monotonic() - started < 1.0  # 20x the interval: slack for loaded CI
        await bridge.publish("r", "values", {})
        assert (await asyncio.wait_for(anext(items), 1)).seq == 2


async def test_retention_bound(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(retention=5)
    await publish_n(bridge, "r", 20)
    await bridge.publish_end("r")  # END never costs an event
    items = await drain(bridge, "r")
    assert seqs(items) == [16, 17, 18, 19, 20]


async def test_cursor_beyond_the_head_is_an_error_not_caught_up(bridge: StreamBridge) -> None:
    await publish_n(bridge, "r", 3)
    async with aclosing(bridge.subscribe("r", last_event_id="10-0")) as items:
        got = [item async for item in items]
    assert [item.kind for item in got] == [EventKind.error]
    assert got[0].event == CURSOR_AHEAD_EVENT and got[0].id == ""
    assert got[0].data | {"message": ""} == {
        "error": "LastEventIdAhead", "message": "", "last_event_id": 10, "head": 3
    }
    assert seqs(await drain_after_end(bridge, "r", "3-0")) == []  # the head itself is fine


async def drain_after_end(bridge: StreamBridge, run_id: str, last_event_id: str) -> list[StreamEvent]:
    await bridge.publish_end(run_id)
    return await drain(bridge, run_id, last_event_id)


async def test_publisher_counter_survives_a_lost_stream(bridge: StreamBridge) -> None:
    """A deleted (expired, restarted-away) stream continues the publisher's numbering: its
    subscribers see a gap, never an id reused for another event."""
    await publish_n(bridge, "r", 4)
    assert bridge.last_seq("r") == 4
    await bridge.delete("r")
    assert [e.seq for e in await publish_n(bridge, "r", 2)] == [5, 6]
    items = await drain_after_end(bridge, "r", "2-0")
    assert seqs(items) == [5, 6]
    assert gaps(items) == [{"requested_after": 2, "resumed_at": 5, "missed": 2}]


async def test_seed_continues_another_owners_numbering(make_bridge: MakeBridge) -> None:
    previous, bridge = make_bridge(), make_bridge()
    assert bridge.last_seq("r") is None
    bridge.seed("r", 7)
    bridge.seed("r", 3)  # never lowers it
    assert bridge.last_seq("r") == 7
    assert (await bridge.publish("r", "values", None)).seq == 8
    assert bridge.last_seq("r") == 8
    with pytest.raises(ValueError):
        bridge.seed("r", -1)
    assert await bridge.publish_end("r") is True
    assert bridge.last_seq("r") is None  # counters are dropped at END: memory stays bounded
    items = await drain(bridge, "r")
    assert seqs(items) == [8] and gaps(items)[0]["missed"] == 7
    del previous


async def test_first_publish_in_a_process_continues_from_the_head(make_bridge: MakeBridge) -> None:
    bridge = make_bridge()
    await publish_n(bridge, "r", 3)
    if bridge.cross_process:  # another process sharing the backend picks up at the head
        other = make_bridge()
        assert (await other.publish("r", "values", None)).seq == 4
        assert other.last_seq("r") == 4


async def test_end_after_lost_events_reports_the_gap(bridge: StreamBridge) -> None:
    await publish_n(bridge, "r", 2)
    bridge.seed("r", 5)  # as if events 3-5 were lost to backend faults
    await bridge.publish_end("r")
    items = await drain(bridge, "r", "2-0")
    assert gaps(items) == [{"requested_after": 2, "resumed_at": 6, "missed": 3}]
    assert items[-1].kind is EventKind.end and items[-1].seq == 5
    items = await drain(bridge, "r", "1-0")  # data, then the lost stretch, then END
    assert [i.kind for i in items] == [EventKind.data, EventKind.gap, EventKind.end]
    assert gaps(items) == [{"requested_after": 2, "resumed_at": 6, "missed": 3}]


async def test_subscriber_limit_refuses_up_front(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(max_subscribers=2)
    first, second = bridge.subscribe("r"), bridge.subscribe("r")
    async with aclosing(first), aclosing(second):
        assert (await anext(first)).kind is EventKind.heartbeat
        assert (await anext(second)).kind is EventKind.heartbeat
        assert bridge.subscribers == 2
        with pytest.raises(TooManySubscribers):
            bridge.subscribe("r")
        assert (await bridge.publish("r", "values", 1)) is not None  # publishing is unaffected
    assert bridge.subscribers == 0
    bridge.check_capacity()
    assert seqs(await drain_after_end(bridge, "r", "-1")) == [1]


async def test_ttl_removes_ended_and_abandoned_streams(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(ttl_s=0.2)
    await publish_n(bridge, "ended", 2)
    await bridge.publish_end("ended")
    await publish_n(bridge, "abandoned", 2)
    assert await bridge.exists("ended") and await bridge.exists("abandoned")
    await asyncio.sleep(0.4)
    assert not await bridge.exists("ended")
    assert not await bridge.exists("abandoned")


async def test_subscribing_does_not_create_a_stream(bridge: StreamBridge) -> None:
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).kind is EventKind.heartbeat
        assert not await bridge.exists("r")
        await publish_n(bridge, "r", 1)
        assert (await asyncio.wait_for(anext(items), 1)).seq == 1
    assert await bridge.exists("r")


async def test_delete_removes_stream_and_fails_its_subscribers(bridge: StreamBridge) -> None:
    await publish_n(bridge, "r", 1)
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).seq == 1
        await bridge.delete("r")
        assert not await bridge.exists("r")
        with pytest.raises(StreamGone):
            async with asyncio.timeout(2):
                async for _ in items:
                    pass


async def test_idle_subscriber_of_expired_stream_is_told(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(ttl_s=0.2)
    await publish_n(bridge, "r", 1)
    with pytest.raises(StreamGone):
        async with asyncio.timeout(2):
            async for _ in bridge.subscribe("r"):
                pass  # event 1, then heartbeats until the abandoned stream expires


async def test_concurrent_publishers_and_subscribers(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(retention=1000)
    per_publisher = 30

    async def publisher(p: int) -> None:
        for n in range(per_publisher):
            await bridge.publish("r", f"p{p}", {"p": p, "n": n})

    subscribers = [asyncio.create_task(drain(bridge, "r", timeout=10)) for _ in range(20)]
    await asyncio.gather(*(publisher(p) for p in range(3)))
    await bridge.publish_end("r")
    results = await asyncio.gather(*subscribers)
    total = 3 * per_publisher
    for items in results:
        assert seqs(items) == list(range(1, total + 1)) and not gaps(items)
        assert len({item.id for item in items if item.kind is EventKind.data}) == total
        for p in range(3):
            assert [i.data["n"] for i in items if i.event == f"p{p}"] == list(range(per_publisher))
    assert all(items == results[0] for items in results)


def test_cross_process_flag(bridge: StreamBridge) -> None:
    assert bridge.cross_process is isinstance(bridge, RedisStreamBridge)


async def test_close_ends_subscriptions_promptly(make_bridge: MakeBridge) -> None:
    bridge = make_bridge()
    await publish_n(bridge, "r", 1)
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).seq == 1
        await bridge.close()
        with pytest.raises(StreamGone):
            async with asyncio.timeout(2):
                async for _ in items:
                    pass
    assert bridge.closed


async def test_an_ended_stream_outlives_its_end_by_the_grace_only(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(end_grace_s=0.3)
    await bridge.publish("r", "values", 1)
    await bridge.publish("live", "values", 1)
    await bridge.publish_end("r")
    assert await bridge.exists("r")
    await asyncio.sleep(0.5)
    assert not await bridge.exists("r")
    assert await bridge.exists("live")  # not ended: kept for ttl_s


async def test_a_thread_watch_wakes_on_an_announcement_made_after_it_opened(make_bridge: MakeBridge) -> None:
    bridge = make_bridge()
    await bridge.announce("t")  # before the watch: not its concern
    async with bridge.watch_thread("t") as watch:
        assert not await watch.wait(0.1)
        await bridge.announce("other")
        assert not await watch.wait(0.1)
        await bridge.announce("t")  # between two waits: still seen by the next one
        assert await watch.wait(1.0)
        assert not await watch.wait(0.1)  # one announcement, one wake-up
        waiter = asyncio.ensure_future(watch.wait(5.0))
        await asyncio.sleep(0.05)
        await bridge.announce("t")
        assert await asyncio.wait_for(waiter, 2.0)


PAD = {"i": 0, "pad": "x" * 980}
AT = {"run_id": "r", "attempt": 1, "step": 3, "journal_seq": 12}


def padded(i: int) -> dict[str, object]:
    return {**PAD, "i": i}


EVENT_BYTES = entry_size("values", encode_data(PAD), encode_data(AT))  # every padded(i < 10) event


async def test_a_run_over_its_byte_budget_keeps_its_newest_events_and_reports_a_gap(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(run_max_bytes=4 * EVENT_BYTES)  # room for four events; retention for 100
    for i in range(10):
        await bridge.publish("r", "values", padded(i), coordinate=AT)
        assert await bridge.retained_bytes("r") == min(i + 1, 4) * EVENT_BYTES
    await bridge.publish_end("r")
    items = await drain(bridge, "r")
    assert gaps(items) == [{"requested_after": 0, "resumed_at": 7, "missed": 6}]
    assert seqs(items) == [7, 8, 9, 10] and [i.data["i"] for i in items if i.kind is EventKind.data] == [6, 7, 8, 9]
    assert seqs(await drain(bridge, "r", "8")) == [9, 10]  # a cursor within what is kept: no gap
    assert not gaps(await drain(bridge, "r", "8"))


async def test_a_slow_subscriber_overtaken_by_byte_trimming_gets_a_gap(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(run_max_bytes=3 * EVENT_BYTES)
    await bridge.publish("r", "values", padded(0), coordinate=AT)
    async with aclosing(bridge.subscribe("r")) as items:
        assert (await anext(items)).seq == 1
        for i in range(1, 8):
            await bridge.publish("r", "values", padded(i), coordinate=AT)
        await bridge.publish_end("r")
        rest = [item async for item in items if item.kind is not EventKind.heartbeat]
    assert gaps(rest) == [{"requested_after": 1, "resumed_at": 6, "missed": 4}]
    assert seqs(rest) == [6, 7, 8] and rest[-1].kind is EventKind.end


async def test_an_event_larger_than_the_byte_budget_is_kept_alone(make_bridge: MakeBridge) -> None:
    bridge = make_bridge(run_max_bytes=2 * EVENT_BYTES)
    for i in range(2):
        await bridge.publish("r", "values", padded(i), coordinate=AT)
    await bridge.publish("r", "values", {"pad": "y" * (3 * EVENT_BYTES)})
    assert await bridge.retained_bytes("r") > 2 * EVENT_BYTES  # the newest event always stays
    await bridge.publish("r", "values", padded(3), coordinate=AT)  # and goes as soon as it is not
    assert await bridge.retained_bytes("r") == EVENT_BYTES
    await bridge.publish_end("r")
    items = await drain(bridge, "r", "1")
    assert gaps(items) == [{"requested_after": 1, "resumed_at": 4, "missed": 2}] and seqs(items) == [4]
    assert await bridge.retained_bytes("never-published") == 0
