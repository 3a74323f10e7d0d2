"""Starting runs go first: the gate's holds, lapses and pauses, and that runs never leak a hold."""

from __future__ import annotations

import asyncio

import pytest
from runtime_support import (
    LIGHT_MATRIX,
    Keel,
    backend_matrix,
    call,
    finished,
    new_thread_id,
    start,
    turn,
)

from agentkeel.runtime import start_gate
from agentkeel.runtime.records import MultitaskStrategy, RunStatus
from agentkeel.runtime.requests import RequestError
from agentkeel.runtime.start_gate import StartGate


async def _spin(turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_release_is_counted_once_and_clears_the_gate() -> None:
    gate = StartGate()
    first, second = gate.hold(), gate.hold()
    assert gate.holders == 2
    first()
    first()  # idempotent: a second call changes nothing
    assert gate.holders == 1
    second()
    assert gate.holders == 0


async def test_step_aside_on_a_clear_gate_does_not_yield() -> None:
    gate = StartGate()
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    task = asyncio.create_task(other())
    await gate.step_aside()
    assert ran == []  # the other task never got a turn: no suspension happened
    await task


async def test_a_running_run_waits_until_the_start_is_over() -> None:
    gate = StartGate(max_pause_s=30, max_hold_s=30)
    release = gate.hold()
    waiting = asyncio.create_task(gate.step_aside())
    await _spin(20)
    assert not waiting.done()
    release()
    await asyncio.wait_for(waiting, 5)


async def test_starts_take_the_slots_in_order_of_arrival() -> None:
    gate = StartGate(max_pause_s=30, max_hold_s=30, slots=1)
    first = await gate.start()
    order: list[str] = []

    async def later(name: str) -> None:
        release = await gate.start()
        order.append(name)
        release()

    waiting = [asyncio.create_task(later(n)) for n in ("second", "third")]
    await _spin(20)
    assert order == [] and gate.holders == 3  # queued starts hold the gate too
    first()
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert order == ["second", "third"]
    assert gate.holders == 0 and gate.free_slots == 1


async def test_a_slow_start_does_not_keep_the_next_waiting_forever() -> None:
    gate = StartGate(max_pause_s=30, max_hold_s=0.05, slots=1)
    await gate.start()  # never released: its slot lapses
    release = await asyncio.wait_for(gate.start(), 5)
    release()
    assert gate.free_slots == 1


async def test_a_pause_is_bounded_and_a_hold_lapses() -> None:
    gate = StartGate(max_pause_s=0.05, max_hold_s=30)
    gate.hold()  # never released
    await asyncio.wait_for(gate.step_aside(), 5)  # gave up waiting after max_pause_s
    assert gate.holders == 1

    lapsing = StartGate(max_pause_s=30, max_hold_s=0.05)
    lapsing.hold()  # never released either: it lapses by itself
    await asyncio.wait_for(lapsing.step_aside(), 5)
    assert lapsing.holders == 0
    short = lapsing.hold(0.05)  # a per-hold lapse
    await asyncio.wait_for(lapsing.step_aside(), 5)
    assert lapsing.holders == 0
    short()  # releasing after the lapse changes nothing
    assert lapsing.holders == 0


@backend_matrix(LIGHT_MATRIX)
async def test_runs_leave_no_hold_behind_however_they_end(keel: Keel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Successful, refused, failing, cancelled-at-once, queued-then-cancelled and
    running-then-cancelled runs: afterwards nothing holds the gate, so running runs would never be
    slowed by a leaked hold. (Holds lapse by themselves; the lapse is put out of reach here.)"""
    monkeypatch.setattr(start_gate, "MAX_HOLD_S", 600.0)
    ok = [turn("done")]
    failing = [{"raise": {"kind": "timeout", "message": "upstream read timed out"}, "repeat": "forever"}]
    slow = [turn(None, call("bash", "c1", command="sleep 30")), turn("never")]
    config = keel.config(
        {"fast": ok, "failing": failing, "slow": slow}, tools={"bash": True},
        limits={"llm_retry": {"max_attempts": 1, "base_delay_ms": 0, "max_delay_ms": 0}},
    )
    async with keel.open(config) as rt:
        gate = rt.manager.start_gate
        done = await start(rt, new_thread_id("ok"))
        assert (await finished(rt, done.run_id)).status == RunStatus.success
        with pytest.raises(RequestError):
            await start(rt, new_thread_id("refused"), model_name="no-such-model")
        failed = await start(rt, new_thread_id("bad"), model_name="failing")
        assert (await finished(rt, failed.run_id)).status == RunStatus.error
        at_once = await start(rt, new_thread_id("at-once"))
        await rt.manager.cancel(at_once.run_id)  # before its task had a turn
        await finished(rt, at_once.run_id)
        thread = new_thread_id("busy")
        running = await start(rt, thread, model_name="slow")
        queued = await start(rt, thread, multitask_strategy=MultitaskStrategy.enqueue)
        await rt.manager.cancel(queued.run_id)
        await rt.manager.cancel(running.run_id)
        await finished(rt, running.run_id)
        await finished(rt, queued.run_id)
        assert gate.holders == 0
        assert gate.free_slots == start_gate.START_SLOTS


async def test_a_run_steps_aside_right_after_its_first_chunk() -> None:
    """A run whose first chunk is out releases its start hold and waits, before its next model
    turn, while other starts hold the gate: the runs started with it must not wait behind it."""
    from types import SimpleNamespace
    from typing import Any

    from agentkeel.runtime.graph_stream import stream_graph
    from agentkeel.runtime.serialization import EventEncoder

    gate = StartGate(max_pause_s=600.0, max_hold_s=600.0)
    own = gate.hold()
    other_start = gate.hold()
    asked: list[int] = []
    published: list[str] = []

    class Graph:
        async def astream(self, *_args: Any, **_kwargs: Any) -> Any:
            for step in range(3):
                asked.append(step)
                yield "values", {"step": step}

    class Bridge:
        async def publish_encoded(self, run_id: str, name: str, data: bytes, **_kwargs: Any) -> None:
            published.append(data.decode())

    prepared = SimpleNamespace(stream_modes=["values"], timeout_s=60, stream_options={},
                               request=SimpleNamespace(stream_subgraphs=False))
    active = SimpleNamespace(prepared=prepared, record=SimpleNamespace(run_id="r1"), abort=None,
                             coordinate=lambda: None, release_start=own)
    task = asyncio.ensure_future(stream_graph(Bridge(), active, Graph(), {}, None, {}, EventEncoder(), gate))  # type: ignore[arg-type]
    await _spin(20)
    assert published == ['{"step":0}'] and asked == [0]  # its own hold is given back ...
    assert gate.holders == 1  # ... and it waits for the other start
    other_start()
    await asyncio.wait_for(task, 5)
    assert asked == [0, 1, 2] and len(published) == 3
