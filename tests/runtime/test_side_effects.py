"""The side-effect ledger read back: which calls an earlier attempt left unfinished, and which of
those must not run again. (The recovery itself, on the agent loop, is in
``tests/harness/test_side_effects_recovery.py``.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from runtime_support import LIGHT_MATRIX, UNGATED, Keel, backend_matrix, call, journal, new_thread_id, run_to_end, turn

from agentkeel.harness.middleware.side_effect_ledger import TOOL_INTENT
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.side_effects import TOOL_RESULT, prior_calls, recovered_notes, unfinished_calls
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.stores.memory import MemoryJournalStore


def _intent(seq: int, call_id: str, name: str, idempotent: bool, attempt: int) -> JournalEvent:
    data = {"call_id": call_id, "name": name, "idempotent": idempotent, "attempt": attempt}
    return JournalEvent("r1", "t1", seq, TOOL_INTENT, data)


def _result(seq: int, call_id: str | None) -> JournalEvent:
    return JournalEvent("r1", "t1", seq, TOOL_RESULT, {"call_id": call_id, "name": "x", "status": "ok"})


async def test_unfinished_calls_are_intents_without_a_later_result() -> None:
    store = MemoryJournalStore()
    await store.append([
        JournalEvent("r1", "t1", 1, "model.call", {}),
        _intent(2, "done", "write_file", False, 1),
        _result(3, "done"),
        _intent(4, "lost_bash", "bash", False, 1),
        _intent(5, "lost_read", "read_file", True, 1),
        _result(6, "never_intended"),  # a tool run without the ledger (a user graph): ignored
        _result(7, None),
        JournalEvent("r1", "t1", 8, TOOL_INTENT, {"name": "no id"}),
        _intent(9, "lost_read", "read_file", True, 2),  # re-run by attempt 2, lost again
        JournalEvent("r2", "t1", 1, TOOL_INTENT, {"call_id": "other_run", "name": "bash"}),
    ])
    unfinished = await unfinished_calls(store, "r1")
    assert sorted(unfinished) == ["lost_bash", "lost_read"]
    assert (unfinished["lost_read"].attempt, unfinished["lost_read"].seq) == (2, 9)
    assert unfinished["lost_bash"].idempotent is False and unfinished["lost_bash"].name == "bash"
    notes = recovered_notes(unfinished)
    assert list(notes) == ["lost_bash"]  # the idempotent one simply runs again
    assert notes["lost_bash"].startswith("started by attempt 1 at ")
    assert notes["lost_bash"].endswith("journal seq 4")


async def test_a_finished_non_idempotent_call_is_never_run_again_either() -> None:
    """Its result was journaled but may not have reached a checkpoint: if the resumed tools step
    runs it again, it is answered instead (its note says it ended)."""
    store = MemoryJournalStore()
    await store.append([
        _intent(1, "done_write", "write_file", False, 1), _result(2, "done_write"),
        _intent(3, "done_read", "read_file", True, 1), _result(4, "done_read"),
    ])
    calls = await prior_calls(store, "r1")
    assert calls["done_write"].result == "ok" and calls["done_read"].result == "ok"
    notes = recovered_notes(calls)
    assert list(notes) == ["done_write"]
    assert notes["done_write"].endswith("it ended (ok) but its result was lost")
    assert await unfinished_calls(store, "r1") == {}


async def test_a_malformed_intent_counts_as_not_idempotent() -> None:
    store = MemoryJournalStore()
    await store.append([JournalEvent("r1", "t1", 1, TOOL_INTENT, {"call_id": "c", "idempotent": "true"})])
    unfinished = await unfinished_calls(store, "r1")
    assert unfinished["c"].idempotent is False and unfinished["c"].name == "unknown"
    assert list(recovered_notes(unfinished)) == ["c"]


async def test_a_run_without_intents_has_nothing_to_recover() -> None:
    assert await unfinished_calls(MemoryJournalStore(), "r1") == {}
    assert recovered_notes({}) == {}


EVENTS = st.lists(st.tuples(st.sampled_from(["intent", "result"]), st.sampled_from("abcd"), st.booleans()))


@given(EVENTS)
async def test_a_call_is_unfinished_exactly_when_its_last_record_is_an_intent(
    events: list[tuple[str, str, bool]],
) -> None:
    store = MemoryJournalStore()
    await store.append([
        _intent(seq, call_id, "t", idem, 1) if kind == "intent" else _result(seq, call_id)
        for seq, (kind, call_id, idem) in enumerate(events, start=1)
    ])
    last: dict[str, tuple[str, bool]] = {}
    for kind, call_id, idem in events:
        if kind == "intent" or call_id in last:
            last[call_id] = (kind, idem)
    expected = {c for c, (kind, _) in last.items() if kind == "intent"}
    unfinished = await unfinished_calls(store, "r1")
    assert set(unfinished) == expected
    assert set(recovered_notes(unfinished)) == {c for c in expected if not last[c][1]}


@backend_matrix(LIGHT_MATRIX)
async def test_a_run_journals_each_intent_before_its_result(keel: Keel) -> None:
    turns = [
        turn("Writing.", call("write_file", "c_write", path="/workspace/a.md", content="x"),
             call("ls", "c_ls", path="/workspace")),
        turn("Done."),
    ]
    async with keel.open(keel.config({"m": turns}, limits=UNGATED)) as rt:
        run = await run_to_end(rt, new_thread_id("intents"), "write")
        assert run.status == RunStatus.success
        events = await journal(rt, run.run_id)
        assert await unfinished_calls(rt.journal, run.run_id) == {}
    intents = {e.data["call_id"]: e for e in events if e.kind == TOOL_INTENT}
    results = {e.data["call_id"]: e for e in events if e.kind == TOOL_RESULT}
    assert set(intents) == set(results) == {"c_write", "c_ls"}
    for call_id, intent in intents.items():
        assert intent.seq < results[call_id].seq
        assert intent.data["attempt"] == 1
    assert (intents["c_write"].data["idempotent"], intents["c_ls"].data["idempotent"]) == (False, True)
