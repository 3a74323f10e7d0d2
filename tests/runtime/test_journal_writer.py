"""Journal: seqs, buffering, background flushes, store failures, bounds, recovery."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from agentkeel.runtime.journal import Journal
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.stores.memory import MemoryJournalStore


class FlakyStore(MemoryJournalStore):
    """A memory store that can be switched to failing, and counts concurrent appends."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.attempts = 0

    async def append(self, events: list[JournalEvent]) -> None:
        self.in_flight += 1
        self.attempts += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.failing:
                raise ConnectionError("store down")
            await super().append(events)
        finally:
            self.in_flight -= 1


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_seqs_are_run_wide_and_flush_writes_in_order() -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1")
    assert journal.record("run.start", {"assistant": "lead"}) == 1
    assert journal.next_seq() == 2
    assert journal.record("model.call", {"model": "m"}, caller="lead") == 3
    assert journal.events_recorded == 2
    assert await journal.flush()
    events = await store.list("r1")
    assert [(e.seq, e.kind, e.caller) for e in events] == [(1, "run.start", None), (3, "model.call", "lead")]
    assert all(e.thread_id == "t1" and e.ts is not None for e in events)
    assert journal.pending == 0


async def test_reserved_seq_lands_in_causal_order() -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1")
    reserved = journal.next_seq()
    journal.record("tool.call", {"call_id": "c1"})
    journal.record("stop_reason", {"code": "loop_capped", "seq": reserved}, seq=reserved)
    await journal.close()
    assert [(e.seq, e.kind) for e in await store.list("r1")] == [(1, "stop_reason"), (2, "tool.call")]


async def test_background_flush_at_threshold_one_in_flight() -> None:
    store = FlakyStore()
    store.gate = asyncio.Event()
    journal = await Journal.open(store, "r1", "t1", flush_every=4)
    for i in range(3):
        journal.record("x", {"i": i})
    await settle()
    assert store.in_flight == 0  # below the threshold nothing is written
    for i in range(3, 20):
        journal.record("x", {"i": i})
    await settle()
    assert store.in_flight == 1
    store.gate.set()
    await journal.close()
    assert store.max_in_flight == 1
    assert [e.seq for e in await store.list("r1")] == list(range(1, 21))


async def test_data_is_copied_and_made_json_safe_at_record_time() -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1")
    data: dict[str, Any] = {"n": {"k": 1}, "when": datetime(2026, 1, 2, tzinfo=UTC), "id": uuid.UUID(int=7)}
    journal.record("x", data)
    data["n"]["k"] = 2
    assert await journal.flush()  # an unserialisable value would otherwise poison every retry
    event = (await store.list("r1"))[0]
    assert event.data == {"n": {"k": 1}, "when": "2026-01-02 00:00:00+00:00", "id": str(uuid.UUID(int=7))}


async def test_store_failure_keeps_events_until_recovery(caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore()
    journal = await Journal.open(store, "r1", "t1", flush_every=2)
    store.failing = True
    for i in range(7):
        journal.record("x", {"i": i})
    await settle()
    assert not await journal.flush()
    assert journal.pending == 7
    assert "writing 7 events failed" in caplog.text
    store.failing = False
    assert await journal.flush()
    assert [e.data["i"] for e in await store.list("r1")] == list(range(7))


async def test_failed_store_is_not_hammered_on_every_record() -> None:
    store = FlakyStore()
    store.failing = True
    journal = await Journal.open(store, "r1", "t1", flush_every=5)
    for _ in range(30):
        journal.record("x")
        await settle()
    # One attempt per ``flush_every`` new records, not one per record.
    assert store.attempts == 6
    assert journal.pending == 30


async def test_buffer_bound_drops_oldest_and_reports(caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore()
    store.failing = True
    journal = await Journal.open(store, "r1", "t1", flush_every=2, max_buffer=10)
    for i in range(25):
        journal.record("x", {"i": i})
    await settle()
    assert journal.dropped == 15
    assert journal.pending == 10
    assert "dropped" in caplog.text
    store.failing = False
    await journal.close()
    events = await store.list("r1")
    assert [e.data.get("i") for e in events[:-1]] == list(range(15, 25))
    assert events[-1].kind == "journal.dropped" and events[-1].data == {"count": 15}
    assert events[-1].seq == 26


async def test_open_surfaces_an_unreachable_store() -> None:
    class Down(MemoryJournalStore):
        async def list(self, *args: object, **kwargs: object) -> list[JournalEvent]:
            raise ConnectionError("no route")

    with pytest.raises(ConnectionError):
        await Journal.open(Down(), "r1", "t1")


@pytest.mark.parametrize(
    "seqs", [[1], [1, 2, 3], [2, 5, 70, 71, 1000], list(range(1, 300)), [7, 64, 65, 129]]
)
async def test_reopened_journal_continues_after_stored_events(seqs: list[int]) -> None:
    store = MemoryJournalStore()
    await store.append([JournalEvent("r1", "t1", s, "x", {}) for s in seqs])
    journal = await Journal.open(store, "r1", "t1")
    assert journal.last_seq == max(seqs)
    assert journal.record("run.start") == max(seqs) + 1


async def test_records_from_threads_get_unique_seqs_and_all_land() -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1", flush_every=16)

    def worker(n: int) -> list[int]:
        return [journal.record("x", {"t": n}) for _ in range(500)]

    results = await asyncio.gather(*(asyncio.to_thread(worker, n) for n in range(8)))
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(1, 4001))
    for r in results:  # each thread saw its own seqs increase
        assert r == sorted(r)
    await journal.close()
    assert [e.seq for e in await store.list("r1")] == seqs


@pytest.mark.parametrize("trigger", [{"flush_every": 2, "flush_ms": 60_000}, {"flush_ms": 30}], ids=["size", "age"])
async def test_record_from_a_thread_flushes_on_the_loop(trigger: dict[str, int]) -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1", **trigger)
    thread = threading.Thread(target=lambda: [journal.record("x") for _ in range(2)])
    thread.start()
    thread.join()
    for _ in range(50):
        await asyncio.sleep(0.01)
        if journal.pending == 0:
            break
    assert len(await store.list("r1")) == 2


async def test_tool_call_seqs_are_indexed() -> None:
    journal = await Journal.open(MemoryJournalStore(), "r1", "t1")
    journal.record("model.call", {})
    seq = journal.record("tool.call", {"call_id": "call_9", "name": "write_file"})
    assert journal.seq_of_tool_call("call_9") == seq == 2
    assert journal.seq_of_tool_call("nope") is None


async def test_record_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1")
    seq = journal.record("x", 5)  # type: ignore[arg-type]
    assert seq == 1
    assert journal.record("y") == 2
    await journal.close()
    assert [e.kind for e in await store.list("r1")] == ["y"]
    assert "could not record x" in caplog.text


async def test_close_never_raises_and_reports_leftovers(caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore()
    journal = await Journal.open(store, "r1", "t1")
    store.failing = True
    journal.record("run.end")
    with caplog.at_level(logging.ERROR):
        await journal.close()
    assert "closed with 1 unwritten events" in caplog.text


async def test_cancelled_flush_keeps_its_events() -> None:
    store = FlakyStore()
    store.gate = asyncio.Event()
    journal = await Journal.open(store, "r1", "t1")
    for _ in range(3):
        journal.record("x")
    task = asyncio.create_task(journal.flush())
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert journal.pending == 3
    store.gate.set()
    assert await journal.flush()
    assert len(await store.list("r1")) == 3


async def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        await Journal.open(MemoryJournalStore(), "r", "t", flush_every=10, max_buffer=5)
