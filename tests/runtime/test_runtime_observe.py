"""Following a run with ``observe``: END last, replay after a Last-Event-ID, the durable record as
the backstop once the stream is gone."""

from __future__ import annotations

import asyncio

import pytest
from runtime_support import (
    FULL_MATRIX,
    Keel,
    backend_matrix,
    call,
    data_events,
    finished,
    new_thread_id,
    run_to_end,
    start,
    stream_events,
    thread_state,
    turn,
    wait_status,
)

from agentkeel.runtime.bridge import EventKind, InvalidEventId
from agentkeel.runtime.observe import FINAL_VALUES_EVENT, RUN_RECORD_EVENT, observe
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.serialization import to_jsonable

pytestmark = backend_matrix(FULL_MATRIX)

CHATTY = [
    turn("Looking.", call("ls", path="/workspace")),
    turn("Looking again.", call("ls", path="/workspace/outputs")),
    turn("Seen enough."),
]


async def test_a_live_observer_gets_every_event_then_end(keel: Keel) -> None:
    config = keel.config({"slowish": [turn("Looking.", call("ls", path="/workspace")), turn("Done.", delay_ms=300)]})
    async with keel.open(config) as rt:
        run = await start(rt, new_thread_id("live"), "look", stream_mode=["values", "updates"])
        await wait_status(rt, run.run_id, RunStatus.running)
        live = asyncio.create_task(stream_events(rt, run.run_id, "-1"))
        done = await finished(rt, run.run_id)
        items = await asyncio.wait_for(live, 10)
        assert done.status == RunStatus.success
        assert items[-1].kind is EventKind.end
        assert sum(1 for i in items if i.kind is EventKind.end) == 1
        assert items[0].event == "metadata"
        assert {i.event for i in items if i.kind is EventKind.data} >= {"metadata", "values", "updates"}
        # What the live observer saw is exactly what a later replay sees.
        replay = await stream_events(rt, run.run_id, "-1")
        strip = [(i.id, i.event, i.data) for i in items if i.kind is EventKind.data]
        assert strip == [(i.id, i.event, i.data) for i in replay if i.kind is EventKind.data]


async def test_replay_is_strictly_after_the_last_event_id(keel: Keel) -> None:
    async with keel.open(keel.config({"chatty": CHATTY})) as rt:
        run = await run_to_end(rt, new_thread_id("replay"), "look")
        full = [i for i in await stream_events(rt, run.run_id, "-1") if i.kind is EventKind.data]
        assert len(full) >= 6
        for cursor in (1, 3, len(full) - 1):
            for form in (full[cursor - 1].id, str(cursor)):  # "N-0" and the bare seq
                after = await stream_events(rt, run.run_id, form)
                assert after[-1].kind is EventKind.end
                assert [(i.id, i.event, i.data) for i in after[:-1]] == [
                    (i.id, i.event, i.data) for i in full[cursor:]
                ]
        # At the last event: nothing but END; beyond it, an error rather than "caught up".
        assert [i.kind for i in await stream_events(rt, run.run_id, full[-1].id)] == [EventKind.end]
        ahead = await stream_events(rt, run.run_id, str(len(full) + 50))
        assert [i.kind for i in ahead] == [EventKind.error] and ahead[0].data["head"] == len(full)


async def test_a_malformed_last_event_id_is_refused(keel: Keel) -> None:
    async with keel.open(keel.config()) as rt:
        run = await run_to_end(rt, new_thread_id("badid"), "hi")
        for bad in ("banana", "1-1", "-2", "12x", "1" * 25):
            seen = []
            with pytest.raises(InvalidEventId):
                async for item in observe(rt, run.run_id, last_event_id=bad):
                    seen.append(item)
            assert seen == []  # refused before anything was yielded


async def test_after_the_stream_is_deleted_the_record_answers_at_once(keel: Keel) -> None:
    async with keel.open(keel.config()) as rt:
        run = await run_to_end(rt, new_thread_id("gone"), "hi")
        last = data_events(await stream_events(rt, run.run_id, "-1"))[-1].seq
        await rt.bridge.delete(run.run_id)
        assert not await rt.bridge.exists(run.run_id)
        for cursor in ("-1", str(last - 1), str(last), "$"):
            items = []
            # A short heartbeat: if observe fell back to waiting on the stream, one would show up.
            async with asyncio.timeout(2):
                async for item in observe(rt, run.run_id, last_event_id=cursor, heartbeat_s=0.05):
                    items.append(item)
            # History was asked for and is gone: a gap says so, and the final state comes with it
            # (not for "$", which asked for none, nor at the last event, which missed none).
            missed = {"-1": last, str(last - 1): 1}.get(cursor)
            lost = ["gap", FINAL_VALUES_EVENT] if missed else []
            assert [i.event for i in items] == [*lost, RUN_RECORD_EVENT, "__end__"], items
            if missed:  # exact on every bridge: the run's run.end journal event kept the last seq
                after = 0 if cursor == "-1" else last - 1
                assert items[0].data == {"requested_after": after, "resumed_at": last + 1, "missed": missed}
            record = items[-2].data
            assert record["run_id"] == run.run_id and record["status"] == "success"
            assert record["stop_reasons"] == [] and record["usage"] == run.usage
        # A run that never existed: END, and nothing else.
        async with asyncio.timeout(2):
            assert [i.kind async for i in observe(rt, "never-existed", heartbeat_s=0.05)] == [EventKind.end]


async def test_a_join_after_the_end_grace_gets_a_gap_the_final_state_and_end(keel: Keel) -> None:
    # A finished run's stream is dropped soon after END; a later join must neither hang nor look
    # complete: a gap for the history it asked for and never read, the state the run ended with,
    # the record, END.
    async with keel.open(keel.config({"chatty": CHATTY}, limits={"stream_end_grace_s": 1.0})) as rt:
        thread_id = new_thread_id("grace")
        run = await run_to_end(rt, thread_id, "look", stream_mode=["values", "updates"])
        assert rt.bridge.last_seq(run.run_id) is None  # forgotten at END: the counter never outlives the run
        assert await rt.bridge.exists(run.run_id)  # within the grace: replayable
        live = data_events(await stream_events(rt, run.run_id, "-1"))
        await asyncio.sleep(1.3)
        assert not await rt.bridge.exists(run.run_id)
        async with asyncio.timeout(2):
            items = [i async for i in observe(rt, run.run_id, last_event_id="1", heartbeat_s=0.05)]
        assert [i.event for i in items] == ["gap", FINAL_VALUES_EVENT, RUN_RECORD_EVENT, "__end__"], items
        last = live[-1].seq
        assert items[0].data == {"requested_after": 1, "resumed_at": last + 1, "missed": last - 1}
        final = items[1]
        assert final.id == ""  # not an event of the stream: a client's Last-Event-ID stays put
        # The final state is what the live stream's last values event carried, and the thread's.
        assert final.data == [i for i in live if i.event == "values"][-1].data
        assert final.data == to_jsonable((await thread_state(rt, thread_id)).values)
        assert describe_json(final.data["messages"])[-1] == ("ai", "Seen enough.")
        assert items[2].data["status"] == "success"
        async with asyncio.timeout(2):  # a live-only join asked for no history: no gap, no state
            live_join = [i.event async for i in observe(rt, run.run_id, last_event_id="$", heartbeat_s=0.05)]
        assert live_join == [RUN_RECORD_EVENT, "__end__"]


async def test_a_late_join_never_presents_another_runs_state_or_a_failed_runs_as_final(keel: Keel) -> None:
    async def late_join(rt: Runtime, run_id: str) -> list[str]:
        async with asyncio.timeout(2):
            return [i.event async for i in observe(rt, run_id, last_event_id="-1", heartbeat_s=0.05)]

    async with keel.open(keel.config({"chatty": CHATTY}, limits={"stream_end_grace_s": 0.5})) as rt:
        thread_id = new_thread_id("later")
        first = await run_to_end(rt, thread_id, "look")
        second = await run_to_end(rt, thread_id, "again")  # moves the thread on
        assert first.status == second.status == RunStatus.success
        await asyncio.sleep(0.8)
        assert await late_join(rt, first.run_id) == ["gap", RUN_RECORD_EVENT, "__end__"]
        assert await late_join(rt, second.run_id) == ["gap", FINAL_VALUES_EVENT, RUN_RECORD_EVENT, "__end__"]
    broken = {"broken": [{"raise": {"kind": "bad_request", "message": "boom"}}]}
    async with keel.open(keel.config(broken, limits={"stream_end_grace_s": 0.5})) as rt:
        failed = await run_to_end(rt, new_thread_id("failed"), "look")
        assert failed.status == RunStatus.error
        await asyncio.sleep(0.8)
        assert await late_join(rt, failed.run_id) == ["gap", RUN_RECORD_EVENT, "__end__"]


def describe_json(messages: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(m["type"], m["content"]) for m in messages]
