"""The process-wide budget for run content held in memory: encoder memos of many concurrent runs
and workspace snapshot content share it, never exceed it, and eviction never changes an encoding."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from runtime_support import LIGHT_MATRIX, Keel, backend_matrix, call, new_thread_id, run_to_end, turn, workspace

from agentkeel.runtime.content_budget import ContentBudget
from agentkeel.runtime.serialization import EventEncoder, to_jsonable
from agentkeel.runtime.snapshots import acapture_snapshot, capture_snapshot, restore_snapshot


def reference(data: Any) -> bytes:
    return json.dumps(to_jsonable(data), default=str, separators=(",", ":"), ensure_ascii=False).encode()


def thread(run: int, turns: int) -> list[Any]:
    messages: list[Any] = [HumanMessage(f"run {run}: " + "hé" * 200, id=f"h{run}")]
    for i in range(turns):
        messages.append(AIMessage(f"r{run} step {i} " + "x" * 300, id=f"a{run}-{i}"))
        messages.append(ToolMessage(f"r{run} result {i} " + "y" * 500, tool_call_id=f"c{i}", id=f"t{run}-{i}"))
    return messages


def test_a_reservation_is_refused_rather_than_exceed_the_budget() -> None:
    budget = ContentBudget(100)
    assert budget.reserve(60) and not budget.reserve(41) and budget.reserve(40)
    assert budget.held == 100 == budget.peak and budget.refused == 1
    budget.release(100)
    assert budget.held == 0
    with pytest.raises(ValueError):
        budget.release(1)  # more than is held: an accounting bug, never silently absorbed
    with pytest.raises(ValueError):
        ContentBudget(-1)


async def test_many_concurrent_runs_stay_under_the_process_budget_with_unchanged_output() -> None:
    # Each encoder alone may remember 64 KiB; 12 of them would hold 768 KiB without the budget.
    budget = ContentBudget(96 * 1024)
    runs = 12
    encoders = [EventEncoder(max_bytes=64 * 1024, budget=budget) for _ in range(runs)]
    unbudgeted = [EventEncoder(max_bytes=64 * 1024) for _ in range(runs)]
    histories = [thread(run, 40) for run in range(runs)]
    highest = 0

    async def run(index: int) -> None:
        nonlocal highest
        messages = histories[index]
        for n in range(1, len(messages) + 1):  # a values stream: the whole history at every step
            data = {"messages": messages[:n]}
            assert encoders[index].encode(data) == unbudgeted[index].encode(data) == reference(data)
            assert budget.held <= budget.max_bytes  # type: ignore[operator]
            highest = max(highest, budget.held)
            await asyncio.sleep(0)  # interleave the runs

    await asyncio.gather(*(run(i) for i in range(runs)))
    assert sum(e.held_bytes for e in encoders) == budget.held  # every held byte is accounted
    assert budget.peak <= 96 * 1024 and highest > 64 * 1024  # used, and bounded
    assert sum(e.held_bytes for e in unbudgeted) > 4 * budget.max_bytes  # type: ignore[operator]
    for encoder in encoders:
        encoder.close()
    assert budget.held == 0


def test_memos_converge_to_equal_shares_instead_of_taking_entries_from_each_other() -> None:
    budget = ContentBudget(30_000)
    first, second = EventEncoder(budget=budget), EventEncoder(budget=budget)
    one, two = {"messages": thread(1, 30)}, {"messages": thread(2, 30)}
    assert first.encode(one) == reference(one)
    assert first.held_bytes > 25_000  # alone, it may use (nearly) the whole budget
    assert second.encode(two) == reference(two)
    entry = max(len(reference(m)) for m in thread(1, 1))  # the largest single message
    assert abs(first.held_bytes - second.held_bytes) <= 2 * entry  # the newcomer took its share
    held = second.held_bytes
    for _ in range(3):  # the first run re-sending its history cannot take the share back
        assert first.encode(one) == reference(one)
    assert second.held_bytes == held and budget.held == first.held_bytes + held <= 30_000


def test_a_snapshot_takes_room_from_the_memos_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    budget = ContentBudget(20_000)
    encoder = EventEncoder(budget=budget)
    messages = thread(0, 10)
    data = {"messages": messages}
    first = encoder.encode(data)
    assert budget.held == encoder.held_bytes > 5_000
    for name, size in (("a.txt", 6_000), ("b.txt", 6_000), ("c.txt", 6_000), ("d.txt", 6_000)):
        (tmp_path / name).write_bytes(b"z" * size)
    snapshot = capture_snapshot(tmp_path, 1_000_000, 1_000_000, budget.reserve, budget.release)
    # Three files fit once the memo gave way; the fourth would exceed the process budget.
    assert [p for p, s in snapshot.items() if s.content is not None] == ["a.txt", "b.txt", "c.txt"]
    assert snapshot.uncaptured == ["d.txt"] and snapshot.content_bytes == 18_000
    assert budget.held == snapshot.content_bytes + encoder.held_bytes <= 20_000
    assert encoder.encode(data) == first == reference(data)  # shed entries re-encode identically
    # A rollback of the file whose content did not fit is refused, not half done.
    (tmp_path / "d.txt").write_bytes(b"changed")
    assert restore_snapshot(tmp_path, snapshot, dry_run=True).unrestorable == ["d.txt"]
    budget.release(snapshot.content_bytes)
    encoder.close()
    assert budget.held == 0


async def test_snapshot_threads_shed_memos_while_runs_encode(tmp_path: Path) -> None:
    # Snapshots are captured on worker threads while encoders run on the loop: the accounting stays
    # exact and the output unchanged under that interleaving.
    budget = ContentBudget(40_000)
    for i in range(30):
        (tmp_path / f"f{i:02}.bin").write_bytes(bytes([i]) * 1_500)
    encoders = [EventEncoder(budget=budget) for _ in range(4)]
    histories = [thread(run, 12) for run in range(4)]
    stop = threading.Event()

    async def encode_all() -> None:
        while not stop.is_set():
            for encoder, messages in zip(encoders, histories, strict=True):
                data = {"messages": messages}
                assert encoder.encode(data) == reference(data)
            # A moment off the GIL, as a loop serving runs has: a busy loop that never waits
            # would starve the snapshot thread of the GIL (5 ms per hand-over) for minutes.
            await asyncio.sleep(0.0005)

    encoding = asyncio.create_task(encode_all())
    snapshots = []
    for _ in range(6):
        snapshot = await acapture_snapshot(tmp_path, 1_000_000, 1_000_000, budget.reserve, budget.release)
        snapshots.append(snapshot)
        assert budget.held <= 40_000
        if len(snapshots) > 2:
            budget.release(snapshots.pop(0).content_bytes)
    stop.set()
    await encoding
    assert budget.held == sum(s.content_bytes for s in snapshots) + sum(e.held_bytes for e in encoders)
    assert budget.peak <= 40_000
    for snapshot in snapshots:
        budget.release(snapshot.content_bytes)
    for encoder in encoders:
        encoder.close()
    assert budget.held == 0


def test_a_file_that_changed_size_since_its_stat_gives_its_reservation_back(tmp_path: Path) -> None:
    budget = ContentBudget(10_000)
    (tmp_path / "a.txt").write_bytes(b"a" * 100)
    seen: list[int] = []

    def reserve(nbytes: int) -> bool:
        seen.append(nbytes)
        (tmp_path / "a.txt").write_bytes(b"a" * 10)  # shrinks between the stat and the read
        return budget.reserve(nbytes)

    snapshot = capture_snapshot(tmp_path, 1_000, 1_000, reserve, budget.release)
    assert seen == [100] and snapshot["a.txt"].content == b"a" * 10
    assert budget.held == snapshot.content_bytes == 10


@backend_matrix(LIGHT_MATRIX)
async def test_a_run_gives_all_its_content_back_when_it_ends(keel: Keel) -> None:
    config = keel.config({"chatty": [turn("Looking.", call("ls", path="/workspace")), turn("Done.")]},
                         limits={"content_max_bytes": 1_000_000})
    thread_id = new_thread_id("content")
    root = workspace(config, thread_id)
    root.mkdir(parents=True, exist_ok=True)
    (root / "kept.txt").write_bytes(b"k" * 50_000)
    async with keel.open(config) as rt:
        assert rt.content.max_bytes == 1_000_000
        run = await run_to_end(rt, thread_id, "look", stream_mode=["values"])
        assert run.status.value == "success"
        assert rt.content.peak >= 50_000  # the "before" snapshot's content was charged...
        assert rt.content.held == 0  # ...and given back with the encoder's memo at the run's end


async def test_a_cancelled_capture_gives_its_reservations_back_when_its_walk_ends(tmp_path: Path) -> None:
    # A run cancelled while its snapshot is being taken: the walk goes on in its thread and must
    # not leave its reservations charged to the process for good.
    budget = ContentBudget(10_000)
    (tmp_path / "a.txt").write_bytes(b"a" * 100)
    entered, go = threading.Event(), threading.Event()

    def reserve(nbytes: int) -> bool:
        entered.set()
        go.wait(5)
        return budget.reserve(nbytes)

    capture = asyncio.ensure_future(acapture_snapshot(tmp_path, 1_000, 1_000, reserve, budget.release))
    assert await asyncio.to_thread(entered.wait, 5)
    capture.cancel()
    with pytest.raises(asyncio.CancelledError):
        await capture
    go.set()
    async with asyncio.timeout(5):
        while budget.peak == 0 or budget.held:
            await asyncio.sleep(0.01)
    assert budget.peak == 100 and budget.held == 0
