"""Journal durability: the age timer bounds what a crash loses; ``write_through`` is durable or raises.

The crash tests run the journal in a child process on SQLite and ``kill -9`` it: nothing of the
child's shutdown path runs, so only what the timer already wrote survives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_journal_writer import FlakyStore, settle

from agentkeel.database import Database
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.journal import Journal, JournalWriteError
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.stores.factory import open_stores
from agentkeel.runtime.stores.memory import MemoryJournalStore

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from agentkeel.database import Database
    from agentkeel.runtime.connections import open_connections
    from agentkeel.runtime.journal import Journal
    from agentkeel.runtime.stores.factory import open_stores

    async def main(url: str, flush_ms: int, every_s: float) -> None:
        async with open_connections(Database.parse(url)) as connections:
            store = (await open_stores(connections)).journal
            journal = await Journal.open(store, "r1", "t1", flush_ms=flush_ms)
            print("ready", flush=True)
            while True:  # one event every ``every_s`` until killed; print when each was recorded
                seq = journal.record("tick", {"at": time.monotonic()})
                print(seq, time.monotonic(), flush=True)
                await asyncio.sleep(every_s)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
    """
)


def _crash_after(db: Path, flush_ms: int, every_s: float, run_s: float) -> tuple[dict[int, float], float]:
    """Run the child journal for ``run_s``, kill -9 it; (seq -> time recorded, kill time)."""
    url = f"sqlite:///{db}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(flush_ms), str(every_s)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(run_s)
        killed_at = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        out = child.stdout.read()  # not ``communicate``: it would skip what ``readline`` buffered
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    recorded = {int(seq): float(at) for seq, at in (line.split() for line in out.splitlines() if line)}
    return recorded, killed_at


async def _stored_seqs(db: Path) -> set[int]:
    async with open_connections(Database.parse(f"sqlite:///{db}")) as connections:
        return {e.seq for e in await (await open_stores(connections)).journal.list("r1")}


async def test_kill_9_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    flush_ms, slack_s = 100, 0.4  # slack: one SQLite commit on a busy test machine
    recorded, killed_at = await asyncio.to_thread(_crash_after, tmp_path / "j.db", flush_ms, 0.01, 1.5)
    stored = await _stored_seqs(tmp_path / "j.db")
    assert len(recorded) > 30  # far below the 32-event size trigger would have been
    must_have = {seq for seq, at in recorded.items() if at < killed_at - flush_ms / 1000 - slack_s}
    assert must_have and must_have <= stored, sorted(must_have - stored)
    assert stored <= set(recorded)


async def test_without_the_timer_a_crash_loses_the_whole_buffer(tmp_path: Path) -> None:
    """The control: with a flush interval longer than the run, kill -9 leaves nothing behind."""
    recorded, _ = await asyncio.to_thread(_crash_after, tmp_path / "j.db", 60_000, 0.02, 0.5)
    assert 0 < len(recorded) < 32
    assert await _stored_seqs(tmp_path / "j.db") == set()


class TimedStore(MemoryJournalStore):
    """Notes when each event was written (``time.monotonic()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.written_at: dict[int, float] = {}

    async def append(self, events: list[JournalEvent]) -> None:
        await super().append(events)
        at = time.monotonic()
        self.written_at.update(dict.fromkeys((e.seq for e in events), at))


async def test_timer_writes_a_small_buffer_once_its_oldest_event_is_due() -> None:
    store, interval = TimedStore(), 0.1
    journal = await Journal.open(store, "r1", "t1", flush_ms=int(interval * 1000))
    recorded = {journal.record("a"): time.monotonic()}
    await asyncio.sleep(interval / 2)
    recorded[journal.record("b")] = time.monotonic()
    await asyncio.sleep(interval * 2)
    recorded[journal.record("c")] = time.monotonic()  # a new buffer starts its own interval
    await asyncio.sleep(interval * 2)
    assert journal.pending == 0 and set(store.written_at) == {1, 2, 3}
    # Never before the oldest buffered event is due; "b" went with "a", so it was written early.
    assert store.written_at[1] == store.written_at[2] >= recorded[1] + interval
    assert store.written_at[3] >= recorded[3] + interval
    assert store.written_at[3] > store.written_at[1]


async def test_timer_retries_a_down_store_with_backoff_then_delivers() -> None:
    store = FlakyStore()
    store.failing = True
    journal = await Journal.open(store, "r1", "t1", flush_ms=20)
    journal.record("x")
    await asyncio.sleep(0.6)
    # Due after 20 ms, then retries after 40, 80, 160, 320 ms: a handful, not one per interval.
    assert 2 <= store.attempts <= 6
    assert journal.pending == 1
    store.failing = False
    await asyncio.sleep(0.7)  # no new record: the timer alone delivers
    assert [e.kind for e in await store.list("r1")] == ["x"]


async def test_close_stops_the_timer() -> None:
    store = FlakyStore()
    journal = await Journal.open(store, "r1", "t1", flush_ms=20)
    journal.record("x")
    store.failing = True
    await journal.close()
    attempts = store.attempts
    await asyncio.sleep(0.2)
    assert store.attempts == attempts  # a closed journal does not keep retrying in the background


async def test_write_through_returns_once_it_and_everything_before_is_stored() -> None:
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1", flush_ms=60_000)
    journal.record("model.call")
    reserved = journal.next_seq()
    seq = await journal.write_through("tool.intent", {"call_id": "c1"}, caller="middleware:M")
    assert seq == 3
    assert [(e.seq, e.kind, e.caller) for e in await store.list("r1")] == [
        (1, "model.call", None), (3, "tool.intent", "middleware:M")
    ]
    journal.record("stop_reason", {"seq": reserved}, seq=reserved)  # a reserved seq still lands
    await journal.close()
    assert [e.seq for e in await store.list("r1")] == [1, 2, 3]


async def test_write_through_waits_for_a_flush_in_flight() -> None:
    store = FlakyStore()
    store.gate = asyncio.Event()
    journal = await Journal.open(store, "r1", "t1")
    journal.record("a")
    flushing = asyncio.create_task(journal.flush())
    await settle()
    assert store.in_flight == 1
    through = asyncio.create_task(journal.write_through("b"))
    await settle()
    assert not through.done()  # "a" is not stored yet, so "b" is not durable in order
    store.gate.set()
    assert await through == 2
    assert [e.kind for e in await store.list("r1")] == ["a", "b"]
    assert store.max_in_flight == 1
    assert await flushing


async def test_write_through_after_a_failed_flush_writes_the_earlier_events_too() -> None:
    store = FlakyStore()
    journal = await Journal.open(store, "r1", "t1")
    store.failing = True
    journal.record("a")
    assert not await journal.flush()
    store.failing = False
    await journal.write_through("b")
    assert [e.kind for e in await store.list("r1")] == ["a", "b"]


async def test_write_through_raises_on_store_failure_and_keeps_the_event() -> None:
    store = FlakyStore()
    journal = await Journal.open(store, "r1", "t1")
    store.failing = True
    with pytest.raises(JournalWriteError, match="tool.intent seq 1 not stored") as info:
        await journal.write_through("tool.intent", {"call_id": "c1"})
    assert isinstance(info.value.__cause__, ConnectionError)
    assert journal.pending == 1
    store.failing = False
    await journal.close()
    assert [e.kind for e in await store.list("r1")] == ["tool.intent"]


async def test_write_through_refuses_unrecordable_data() -> None:
    journal = await Journal.open(MemoryJournalStore(), "r1", "t1")
    with pytest.raises(TypeError, match="cannot record x"):
        await journal.write_through("x", 5)  # type: ignore[arg-type]
    assert journal.pending == 0


async def test_flush_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        await Journal.open(MemoryJournalStore(), "r", "t", flush_ms=0)


async def test_a_fenced_journal_refuses_write_through_and_its_timer_writes_nothing() -> None:
    """An attempt that lost its run must not start a tool: its intent cannot be made durable."""
    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1", flush_ms=20)
    await journal.write_through("tool.intent", {"call_id": "before"})
    journal.record("model.call")
    journal.fence()
    with pytest.raises(JournalWriteError, match="fenced"):
        await journal.write_through("tool.intent", {"call_id": "after"})
    journal.record("tool.call")
    await asyncio.sleep(0.1)
    assert not await journal.flush()
    assert [e.data.get("call_id") for e in await store.list("r1")] == ["before"]
