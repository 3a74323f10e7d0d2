"""The one suite every RunStore/JournalStore pair must pass: memory, SQLite and PostgreSQL.

PostgreSQL tests share a database of this module's own (``module_pg_url``) and stay apart through
fresh thread ids; the few tests that list every row ask for an ``empty`` store (a database of their
own). Not the session's ``pg_url``: these tests leave pending and running runs behind, which a
runtime test's worker on that database would claim.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from agentkeel.database import Database
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.records import (
    Completion,
    ConflictError,
    FencedOut,
    InvalidTransition,
    MultitaskStrategy,
    OnDisconnect,
    RunRecord,
    RunStatus,
    new_run_id,
)
from agentkeel.runtime.stores.base import JournalEvent, JournalStore, RunStore, StartClaim
from agentkeel.runtime.stores.factory import open_stores

Stores = tuple[RunStore, JournalStore]
BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _url(request: pytest.FixtureRequest, tmp_path: Path, *, empty: bool) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/db/keel.db"
    return str(request.getfixturevalue("fresh_pg_url" if empty else "module_pg_url"))


async def _open(url: str) -> AsyncIterator[Stores]:
    async with open_connections(Database.parse(url)) as connections:
        run_store, journal, _ = await open_stores(connections)
        yield run_store, journal


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    async for pair in _open(_url(request, tmp_path, empty=False)):
        yield pair


@pytest.fixture(params=BACKENDS)
async def empty_stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    async for pair in _open(_url(request, tmp_path, empty=True)):
        yield pair


@pytest.fixture
def tid() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def run(
    thread_id: str, strategy: MultitaskStrategy = MultitaskStrategy.reject, **fields: object
) -> RunRecord:
    return RunRecord(
        run_id=new_run_id(),
        thread_id=thread_id,
        assistant_id="lead",
        multitask_strategy=strategy,
        **fields,  # type: ignore[arg-type]
    )


def ids(records: list[RunRecord]) -> list[str]:
    return [r.run_id for r in records]


DONE = Completion(
    status=RunStatus.success,
    stop_reasons=[{"code": "turn_capped", "seq": 7, "detail": {"turns": 3}}],
    usage={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15, "by_caller": {}},
)


# -- admission --------------------------------------------------------------------------------
async def test_admit_and_get_round_trip_every_field(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = run(
        tid,
        MultitaskStrategy.enqueue,
        owner="worker-1",
        lease_expires_at=datetime(2025, 3, 1, 14, 30, tzinfo=timezone(timedelta(hours=2))),
        on_disconnect=OnDisconnect.cancel,
        kwargs={"input": {"messages": [{"role": "user", "content": "hi ü"}]}, "n": [1, 2.5, None]},
        metadata={"user": "ada", "nested": {"flag": True}},
        created_at=T0,
        updated_at=T0 + timedelta(seconds=1),
        stop_reasons=[{"code": "x"}],
        usage={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3, "by_model": {"m": {}}},
        error="none yet",
    )
    admitted = await run_store.admit(record)
    fetched = await run_store.get(record.run_id)

    assert admitted.record == record
    assert fetched == record
    assert admitted.active_before == []
    assert fetched is not None and fetched.lease_expires_at is not None
    assert fetched.lease_expires_at.utcoffset() == timedelta(0)
    assert fetched.created_at.tzinfo is not None and fetched.created_at == T0
    thread = await run_store.get_thread(tid)
    assert thread is not None and thread.status == "idle"


async def test_returned_records_are_copies(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = run(tid, kwargs={"a": {"b": 1}})
    admitted = await run_store.admit(record)
    record.kwargs["a"]["b"] = 2
    admitted.record.kwargs["a"]["b"] = 3
    fetched = await run_store.get(record.run_id)
    assert fetched is not None
    fetched.status = RunStatus.error
    fetched.kwargs["a"]["b"] = 4
    again = await run_store.get(record.run_id)
    assert (
        again is not None and again.kwargs == {"a": {"b": 1}} and again.status is RunStatus.pending
    )


async def test_reject_with_active_run_raises_and_writes_nothing(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    first = run(tid)
    await run_store.admit(first)
    thread_before = await run_store.get_thread(tid)
    refused = run(tid)
    with pytest.raises(ConflictError, match=first.run_id):
        await run_store.admit(refused)
    assert await run_store.get(refused.run_id) is None
    assert ids(await run_store.list_runs(thread_id=tid)) == [first.run_id]
    assert await run_store.get_thread(tid) == thread_before

    await run_store.mark_running(first.run_id, 1, "w", None)  # running counts as active too
    with pytest.raises(ConflictError):
        await run_store.admit(run(tid))

    await run_store.finish(first.run_id, 1, DONE)
    assert (await run_store.admit(refused)).active_before == []


async def test_other_strategies_report_active_runs_oldest_first(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    a = (await run_store.admit(run(tid))).record
    b = await run_store.admit(run(tid, MultitaskStrategy.enqueue))
    assert ids(b.active_before) == [a.run_id]
    c = await run_store.admit(run(tid, MultitaskStrategy.enqueue))  # several pending are legal
    await run_store.mark_running(a.run_id, 1, "w", None)
    d = await run_store.admit(run(tid, MultitaskStrategy.interrupt))
    assert ids(d.active_before) == [a.run_id, b.record.run_id, c.record.run_id]
    assert d.active_before[0].status is RunStatus.running
    e = await run_store.admit(run(tid, MultitaskStrategy.rollback))
    assert ids(e.active_before) == [*ids(d.active_before), d.record.run_id]
    await run_store.finish(b.record.run_id, 1, DONE)
    active = await run_store.active_runs(tid)
    assert ids(active) == [a.run_id, c.record.run_id, d.record.run_id, e.record.run_id]


async def test_admission_refuses_duplicates_and_non_pending(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = run(tid, MultitaskStrategy.enqueue)
    await run_store.admit(record)
    with pytest.raises(ValueError, match="already exists"):
        await run_store.admit(record)
    with pytest.raises(InvalidTransition):
        await run_store.admit(run(tid, MultitaskStrategy.enqueue, status=RunStatus.running))
    assert ids(await run_store.list_runs(thread_id=tid)) == [record.run_id]


async def test_admission_stamps_the_threads_metadata_only_when_it_admits(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    await run_store.upsert_thread(tid, {"owner": "ann", "graph_id": "old"})
    first = (await run_store.admit(run(tid), thread_metadata={"graph_id": "lead", "assistant_id": "a1"})).record
    thread = await run_store.get_thread(tid)
    assert thread is not None  # merged: the stamp's keys win, the others stay
    assert thread.metadata == {"owner": "ann", "graph_id": "lead", "assistant_id": "a1"}
    with pytest.raises(ConflictError):  # refused (the thread is busy): nothing stamped
        await run_store.admit(run(tid), thread_metadata={"graph_id": "other"})
    thread = await run_store.get_thread(tid)
    assert thread is not None and thread.metadata["graph_id"] == "lead"
    # A new thread is created with the stamp, in the same transaction as its run; a claimed run's
    # thread is busy and stamped at once.
    fresh = f"{tid}-new"
    claimed = await run_store.admit(run(fresh), StartClaim("w1", datetime.now(UTC) + timedelta(seconds=30)),
                                    thread_metadata={"graph_id": "lead"})
    thread = await run_store.get_thread(fresh)
    assert thread is not None and (thread.status, thread.metadata) == ("busy", {"graph_id": "lead"})
    assert first.status is RunStatus.pending
    await run_store.finish(claimed.record.run_id, 1, DONE)


# -- mark_running ------------------------------------------------------------------------------
async def test_mark_running_only_pending_at_that_attempt(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    with pytest.raises(FencedOut, match="no attempt 2"):
        await run_store.mark_running(record.run_id, 2, "w", None)
    with pytest.raises(FencedOut, match="does not exist"):
        await run_store.mark_running(new_run_id(), 1, "w", None)

    lease = datetime.now(UTC) + timedelta(seconds=30)
    running = await run_store.mark_running(record.run_id, 1, "worker-a", lease)
    assert (running.status, running.owner, running.lease_expires_at) == (
        RunStatus.running,
        "worker-a",
        lease,
    )
    assert running.started_at is not None and running.started_at >= record.created_at
    assert await run_store.get(record.run_id) == running
    with pytest.raises(FencedOut, match="is running"):
        await run_store.mark_running(record.run_id, 1, "w", None)


async def test_second_running_run_of_a_thread_is_refused(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    a = (await run_store.admit(run(tid))).record
    b = (await run_store.admit(run(tid, MultitaskStrategy.enqueue))).record
    await run_store.mark_running(a.run_id, 1, "w", None)
    with pytest.raises(ConflictError):
        await run_store.mark_running(b.run_id, 1, "w", None)
    refused = await run_store.get(b.run_id)
    assert refused is not None and refused.status is RunStatus.pending

    await run_store.finish(a.run_id, 1, DONE)
    assert (await run_store.mark_running(b.run_id, 1, "w", None)).status is RunStatus.running


# -- fenced completion -------------------------------------------------------------------------
async def test_late_completion_of_a_superseded_attempt_is_refused(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    await run_store.mark_running(record.run_id, 1, "old-worker", None)
    claimed = await run_store.claim(record.run_id, "new-worker", None)
    assert (claimed.attempt, claimed.owner, claimed.status) == (2, "new-worker", RunStatus.running)

    late = Completion(RunStatus.error, [{"code": "lease_lost"}], {"total_tokens": 99}, "stale")
    with pytest.raises(FencedOut, match="superseded by attempt 2"):
        await run_store.finish(record.run_id, 1, late)
    assert not await run_store.update_usage(record.run_id, 1, {"total_tokens": 99})

    finished = await run_store.finish(record.run_id, 2, DONE)
    with pytest.raises(FencedOut):
        await run_store.finish(record.run_id, 1, late)  # even later: still refused
    stored = await run_store.get(record.run_id)
    assert stored == finished
    assert (stored.status, stored.stop_reasons, stored.usage, stored.error) == (
        RunStatus.success,
        DONE.stop_reasons,
        DONE.usage,
        None,
    )


async def test_terminal_status_is_never_replaced(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    await run_store.mark_running(record.run_id, 1, "w", None)
    first = await run_store.finish(record.run_id, 1, DONE)
    assert first.ended_at is not None and first.status is RunStatus.success

    second = Completion(RunStatus.interrupted, [{"code": "cancelled"}], {}, "cancelled")
    with pytest.raises(FencedOut, match="already ended with status success"):
        await run_store.finish(record.run_id, 1, second)
    with pytest.raises(FencedOut, match="already ended"):
        await run_store.claim(record.run_id, "thief", None)
    assert await run_store.get(record.run_id) == first


async def test_finish_needs_a_terminal_status(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    with pytest.raises(InvalidTransition):
        await run_store.finish(record.run_id, 1, Completion(RunStatus.running, [], {}))
    assert await run_store.get(record.run_id) == record


async def test_a_pending_run_can_be_finished(stores: Stores, tid: str) -> None:
    """Cancelling before a worker started it."""
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    done = await run_store.finish(
        record.run_id, 1, Completion(RunStatus.interrupted, [{"code": "cancelled"}], {})
    )
    assert done.status is RunStatus.interrupted and done.started_at is None
    assert await run_store.active_runs(tid) == []


async def test_update_usage_is_fenced(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    await run_store.mark_running(record.run_id, 1, "w", None)
    usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7, "by_caller": {"lead": 7}}
    assert await run_store.update_usage(record.run_id, 1, usage)
    stored = await run_store.get(record.run_id)
    assert stored is not None and stored.usage == usage
    assert not await run_store.update_usage(record.run_id, 2, {"total_tokens": 1})
    assert not await run_store.update_usage(new_run_id(), 1, {"total_tokens": 1})
    await run_store.finish(record.run_id, 1, DONE)
    assert not await run_store.update_usage(record.run_id, 1, {"total_tokens": 1})
    stored = await run_store.get(record.run_id)
    assert stored is not None and stored.usage == DONE.usage


async def test_claim_takes_over_an_active_run(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    record = (await run_store.admit(run(tid))).record
    lease = datetime.now(UTC) + timedelta(seconds=30)
    claimed = await run_store.claim(record.run_id, "w2", lease)
    assert (claimed.attempt, claimed.owner, claimed.lease_expires_at) == (2, "w2", lease)
    assert claimed.status is RunStatus.pending  # a pending run stays pending for its new owner
    with pytest.raises(FencedOut, match="superseded"):
        await run_store.mark_running(record.run_id, 1, "w1", None)
    assert (await run_store.mark_running(record.run_id, 2, "w2", lease)).attempt == 2
    with pytest.raises(FencedOut, match="does not exist"):
        await run_store.claim(new_run_id(), "w", None)


# -- reads and deletes ---------------------------------------------------------------------------
async def test_list_runs_filters_and_orders_newest_first(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    t1, t2 = "thread-one", "thread-two"
    a = run(t1, created_at=T0)
    b = run(t1, MultitaskStrategy.enqueue, created_at=T0 + timedelta(seconds=2))
    c = run(t2, created_at=T0 + timedelta(seconds=1))
    d = run(t1, MultitaskStrategy.enqueue, created_at=T0 + timedelta(seconds=2))  # tie with b
    for record in (a, b, c, d):
        await run_store.admit(record)
    await run_store.finish(a.run_id, 1, DONE)

    assert ids(await run_store.list_runs()) == ids([d, b, c, a])
    assert ids(await run_store.list_runs(thread_id=t1)) == ids([d, b, a])
    assert ids(await run_store.list_runs(statuses=[RunStatus.success])) == [a.run_id]
    pending = await run_store.list_runs(thread_id=t1, statuses=[RunStatus.pending])
    assert ids(pending) == ids([d, b])
    assert ids(await run_store.list_runs(limit=2, offset=1)) == ids([b, c])
    assert await run_store.list_runs(thread_id="nobody") == []


async def test_count_runs_counts_each_asked_status(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    statuses = [RunStatus.pending, RunStatus.running]
    assert await run_store.count_runs(statuses) == {RunStatus.pending: 0, RunStatus.running: 0}
    a, b, c = run("thread-a"), run("thread-b"), run("thread-b", MultitaskStrategy.enqueue)
    d = run("thread-d")
    for record in (a, b, c, d):
        await run_store.admit(record)
    await run_store.mark_running(b.run_id, 1, "w", None)
    await run_store.finish(d.run_id, 1, DONE)
    assert await run_store.count_runs(statuses) == {RunStatus.pending: 2, RunStatus.running: 1}
    assert await run_store.count_runs([RunStatus.success, RunStatus.error]) == {RunStatus.success: 1, RunStatus.error: 0}


async def test_delete_run_removes_its_journal(stores: Stores, tid: str) -> None:
    run_store, journal = stores
    a = (await run_store.admit(run(tid))).record
    b = (await run_store.admit(run(tid, MultitaskStrategy.enqueue))).record
    await journal.append([event(a, 1), event(b, 1)])
    assert await run_store.delete_run(a.run_id)
    assert await run_store.get(a.run_id) is None
    assert await journal.list(a.run_id) == []
    assert len(await journal.list(b.run_id)) == 1
    assert not await run_store.delete_run(a.run_id)
    assert ids(await run_store.active_runs(tid)) == [b.run_id]


# -- threads -----------------------------------------------------------------------------------
async def test_create_thread_inserts_only_a_new_id(stores: Stores, tid: str) -> None:
    """Of concurrent creators of one id exactly one gets the thread; the others change nothing."""
    run_store, _ = stores
    results = await asyncio.gather(*(run_store.create_thread(tid, {"owner": f"u{i}"}) for i in range(5)))
    created = [r for r in results if r is not None]
    assert len(created) == 1 and created[0].status == "idle"
    stored = await run_store.get_thread(tid)
    assert stored is not None and stored.metadata == created[0].metadata
    assert await run_store.create_thread(tid, {"owner": "late"}) is None
    assert (await run_store.get_thread(tid)).metadata == created[0].metadata  # type: ignore[union-attr]


async def test_thread_upsert_get_and_status(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    created = await run_store.upsert_thread(tid, {"title": "t", "tags": ["a"]})
    assert (created.thread_id, created.status, created.metadata) == (
        tid,
        "idle",
        {"title": "t", "tags": ["a"]},
    )
    merged = await run_store.upsert_thread(tid, {"title": "renamed", "owner": "ada"})
    assert merged.metadata == {"title": "renamed", "tags": ["a"], "owner": "ada"}
    assert merged.created_at == created.created_at and merged.updated_at >= created.updated_at

    await run_store.set_thread_status(tid, "busy")
    fetched = await run_store.get_thread(tid)
    assert fetched is not None and fetched.status == "busy" and fetched.metadata == merged.metadata
    with pytest.raises(ValueError):
        await run_store.set_thread_status(tid, "sleeping")
    await run_store.set_thread_status("missing-" + tid, "busy")  # a deleted thread stays deleted
    assert await run_store.get_thread("missing-" + tid) is None


async def test_list_threads_newest_first(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    for name in ("t-a", "t-b", "t-c"):
        await run_store.upsert_thread(name)
    await run_store.upsert_thread("t-a", {"touched": True})  # updating does not reorder
    assert [t.thread_id for t in await run_store.list_threads()] == ["t-c", "t-b", "t-a"]
    assert [t.thread_id for t in await run_store.list_threads(limit=1, offset=1)] == ["t-b"]


async def test_delete_thread_cascades_runs_and_journal(stores: Stores, tid: str) -> None:
    run_store, journal = stores
    a = (await run_store.admit(run(tid))).record
    b = (await run_store.admit(run(tid, MultitaskStrategy.enqueue))).record
    other = (await run_store.admit(run(tid + "-other"))).record
    await journal.append([event(a, 1), event(b, 1), event(other, 1)])

    assert await run_store.delete_thread(tid)
    assert await run_store.get_thread(tid) is None
    assert await run_store.get(a.run_id) is None and await run_store.get(b.run_id) is None
    assert await run_store.list_runs(thread_id=tid) == []
    assert await journal.list(a.run_id) == [] and await journal.list(b.run_id) == []
    assert await run_store.get(other.run_id) == other
    assert len(await journal.list(other.run_id)) == 1
    assert not await run_store.delete_thread(tid)


# -- journal -----------------------------------------------------------------------------------
def event(record: RunRecord, seq: int, kind: str = "model.call", **data: object) -> JournalEvent:
    return JournalEvent(
        run_id=record.run_id, thread_id=record.thread_id, seq=seq, kind=kind, data=dict(data)
    )


async def test_journal_append_is_idempotent_and_ordered(stores: Stores, tid: str) -> None:
    _, journal = stores
    record = run(tid)
    stamped = T0 + timedelta(minutes=5)
    first = [
        event(record, 3, "tool.call", name="bash"),
        event(record, 1, "run.start"),
        JournalEvent(record.run_id, tid, 2, "model.call", {"n": [1, {"x": None}]}, "lead", stamped,
                     attempt=2, step=7),  # the run coordinate's attempt and step round-trip
    ]
    await journal.append(first)
    await journal.append([event(record, 2, "overwrite", n=0), event(record, 4, "run.end")])
    await journal.append([])

    events = await journal.list(record.run_id)
    assert [(e.seq, e.kind) for e in events] == [
        (1, "run.start"),
        (2, "model.call"),
        (3, "tool.call"),
        (4, "run.end"),
    ]
    assert events[1] == first[2]  # the first write of a seq stands
    assert events[2].data == {"name": "bash"} and events[2].caller is None
    assert (events[2].attempt, events[2].step) == (None, None)
    assert all(e.ts is not None and e.ts.utcoffset() == timedelta(0) for e in events)


async def test_journal_filters(stores: Stores, tid: str) -> None:
    _, journal = stores
    record, other = run(tid), run(tid)
    kinds = ["run.start", "model.call", "tool.call", "model.call", "run.end"]
    await journal.append([event(record, i + 1, k) for i, k in enumerate(kinds)])
    await journal.append([event(other, 1, "run.start")])

    assert [e.seq for e in await journal.list(record.run_id, after_seq=2)] == [3, 4, 5]
    assert [e.seq for e in await journal.list(record.run_id, limit=2)] == [1, 2]
    assert [e.seq for e in await journal.list(record.run_id, after_seq=1, limit=2)] == [2, 3]
    calls = await journal.list(record.run_id, kinds=["model.call", "run.end"])
    assert [e.seq for e in calls] == [2, 4, 5]
    assert await journal.list(record.run_id, kinds=[]) == []
    assert await journal.list(new_run_id()) == []

    await journal.delete_run(record.run_id)
    assert await journal.list(record.run_id) == []
    assert len(await journal.list(other.run_id)) == 1
