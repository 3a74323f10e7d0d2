"""Conformance of the ownership operations (claims, leases, recovery, stored control requests) on
every RunStore: memory, SQLite and PostgreSQL. Same fixtures as ``test_store_conformance.py``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from test_store_conformance import DONE, Stores, empty_stores, run, stores, tid  # noqa: F401

from agentkeel.runtime.records import (
    Completion,
    ConflictError,
    ControlPending,
    FencedOut,
    MultitaskStrategy,
    RunStatus,
    empty_usage,
    new_run_id,
)
from agentkeel.runtime.stores.base import JournalEvent, Lease, StartClaim

CANCEL = {"action": "interrupt", "code": "cancelled", "source": "gateway", "detail": "by request"}
INTERRUPTED = Completion(RunStatus.interrupted, [{"code": "cancelled"}], empty_usage(), None, True)


def lease(seconds: float = 30) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def claim_mine(stores: Stores, thread_id: str) -> str:
    """Claim until a run of ``thread_id`` is claimed (the shared database holds other tests' runs)."""
    run_store, _ = stores
    for _ in range(50):
        got = await run_store.claim_next("w1", lease(), datetime.now(UTC))
        if got is None:
            break
        if got.thread_id == thread_id:
            return got.run_id
    raise AssertionError(f"no run of {thread_id} was claimable")


async def test_claim_next_is_fifo_per_thread_and_one_running(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    a = (await run_store.admit(run("t1"))).record
    b = (await run_store.admit(run("t1", MultitaskStrategy.enqueue))).record
    c = (await run_store.admit(run("t2"))).record
    now = datetime.now(UTC)
    first = await run_store.claim_next("w1", lease(), now)
    second = await run_store.claim_next("w2", lease(), now)
    assert first is not None and second is not None
    assert {first.run_id, second.run_id} == {a.run_id, c.run_id}  # b waits behind a
    assert first.status is RunStatus.running and first.attempt == 1 and first.owner == "w1"
    for claimed in (first, second):  # the thread is busy from the claim on, not from the worker's start
        thread = await run_store.get_thread(claimed.thread_id)
        assert thread is not None and thread.status == "busy"
    assert await run_store.claim_next("w3", lease(), now) is None
    await run_store.finish(a.run_id, 1, DONE)
    third = await run_store.claim_next("w3", lease(), datetime.now(UTC))
    assert third is not None and third.run_id == b.run_id


async def test_an_admission_with_a_claim_starts_a_startable_run_as_claim_next_would(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    expires = lease()
    admitted = await run_store.admit(run(tid), StartClaim("w1", expires))
    record = admitted.record
    assert admitted.active_before == []
    assert record.status is RunStatus.running and record.attempt == 1 and record.owner == "w1"
    assert record.lease_expires_at == expires and record.started_at is not None
    assert await run_store.get(record.run_id) == record  # stored as returned
    thread = await run_store.get_thread(tid)
    assert thread is not None and thread.status == "busy"  # busy from the admission, like a claim
    # It is nobody else's to claim, and it holds its thread: the next run queues behind it.
    queued = (await run_store.admit(run(tid, MultitaskStrategy.enqueue), StartClaim("w1", lease()))).record
    assert queued.status is RunStatus.pending and queued.owner is None and queued.lease_expires_at is None
    with pytest.raises(ConflictError):  # reject, with a claim or not, writes nothing
        await run_store.admit(run(tid), StartClaim("w1", lease()))
    await run_store.finish(record.run_id, 1, DONE)
    assert await claim_mine(stores, tid) == queued.run_id  # FIFO: the queued run is next


async def test_an_admission_with_a_claim_leaves_a_delayed_run_pending(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    later = datetime.now(UTC) + timedelta(hours=1)
    record = (await run_store.admit(run(tid, not_before=later), StartClaim("w1", lease()))).record
    assert record.status is RunStatus.pending and record.owner is None and record.started_at is None
    thread = await run_store.get_thread(tid)
    assert thread is not None and thread.status == "idle"


async def test_admissions_with_claims_racing_on_one_thread_start_one_run(empty_stores: Stores) -> None:
    """Each admission decides under the thread's lock: exactly one of them finds the thread free."""
    run_store, _ = empty_stores
    results = await asyncio.gather(*(
        run_store.admit(run("t1", MultitaskStrategy.enqueue), StartClaim(f"w{i}", lease())) for i in range(6)
    ))
    assert sorted(r.record.status.value for r in results) == ["pending"] * 5 + ["running"]
    active = await run_store.active_runs("t1")
    assert active[0].status is RunStatus.running  # the head of the queue is the one that runs
    assert [r.status for r in active[1:]] == [RunStatus.pending] * 5


async def test_concurrent_claimers_get_each_run_once(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    admitted = {(await run_store.admit(run(f"t{i}"))).record.run_id for i in range(8)}

    async def claimer(name: str) -> list[str]:
        got = []
        while (record := await run_store.claim_next(name, lease(), datetime.now(UTC))) is not None:
            got.append(record.run_id)
        return got

    results = await asyncio.gather(*(claimer(f"w{i}") for i in range(4)))
    claimed = [run_id for batch in results for run_id in batch]
    assert sorted(claimed) == sorted(admitted)  # every run exactly once


async def test_not_before_delays_the_claim(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    later = datetime.now(UTC) + timedelta(hours=1)
    delayed = (await run_store.admit(run("t1", not_before=later))).record
    assert await run_store.claim_next("w", lease(), datetime.now(UTC)) is None
    assert await run_store.next_start_at() == later
    got = await run_store.claim_next("w", lease(), later + timedelta(seconds=1))
    assert got is not None and got.run_id == delayed.run_id
    assert await run_store.next_start_at() is None


async def test_renew_leases_is_fenced_per_run_and_keeps_the_highest_stream_seq(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    await run_store.admit(run(tid))
    run_id = await claim_mine(stores, tid)
    renewed = await run_store.renew_leases("w1", lease(60), [Lease(run_id, 1, 7)])
    assert renewed[run_id] is not None and renewed[run_id].stream_seq == 7  # type: ignore[union-attr]
    renewed = await run_store.renew_leases("w1", lease(60), [Lease(run_id, 1, 3)])
    assert renewed[run_id] is not None and renewed[run_id].stream_seq == 7  # type: ignore[union-attr]
    assert (await run_store.renew_leases("someone-else", lease(), [Lease(run_id, 1)]))[run_id] is None
    assert (await run_store.renew_leases("w1", lease(), [Lease(run_id, 2)]))[run_id] is None
    gone = new_run_id()
    both = await run_store.renew_leases("w1", lease(), [Lease(run_id, 1), Lease(gone, 1)])
    assert both[run_id] is not None and both[gone] is None  # one batch, answered run by run
    await run_store.claim(run_id, "w2", lease(), attempt=1)
    assert (await run_store.renew_leases("w1", lease(), [Lease(run_id, 1)]))[run_id] is None  # superseded


async def test_expired_runs_and_a_single_recoverer(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    await run_store.admit(run(tid))
    run_id = await claim_mine(stores, tid)
    await run_store.renew_leases("w1", datetime.now(UTC) - timedelta(seconds=1), [Lease(run_id, 1)])
    expired = await run_store.expired_runs(datetime.now(UTC), limit=1000)
    assert run_id in {r.run_id for r in expired}
    results = await asyncio.gather(
        *(run_store.claim(run_id, f"r{i}", lease(), attempt=1) for i in range(3)),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1 and winners[0].attempt == 2
    assert all(isinstance(r, FencedOut) for r in results if isinstance(r, BaseException))
    assert run_id not in {r.run_id for r in await run_store.expired_runs(datetime.now(UTC), 1000)}
    with pytest.raises(FencedOut):
        await run_store.finish(run_id, 1, DONE)  # the lost owner's late completion


async def test_control_request_first_one_wins_over_completion(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    await run_store.admit(run(tid))
    run_id = await claim_mine(stores, tid)
    stored = await run_store.request_control(run_id, CANCEL)
    assert stored.control == CANCEL
    again = await run_store.request_control(run_id, {**CANCEL, "code": "rolled_back"})
    assert again.control == CANCEL  # the first request stands
    with pytest.raises(ControlPending) as refused:
        await run_store.finish(run_id, 1, DONE)  # a completion ignoring the request loses
    assert refused.value.control == CANCEL
    finished = await run_store.finish(run_id, 1, INTERRUPTED)
    assert finished.status is RunStatus.interrupted and finished.lease_expires_at is None
    with pytest.raises(FencedOut):
        await run_store.request_control(run_id, CANCEL)  # ended: the completion was first


async def test_finish_pending_never_ends_a_claimed_run(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    queued = (await run_store.admit(run(tid))).record
    run_id = await claim_mine(stores, tid)
    assert run_id == queued.run_id
    with pytest.raises(FencedOut):
        await run_store.finish_pending(run_id, 1, INTERRUPTED)
    other = (await run_store.admit(run(tid, MultitaskStrategy.enqueue))).record
    done = await run_store.finish_pending(other.run_id, 1, INTERRUPTED)
    assert done.status is RunStatus.interrupted
    with pytest.raises(FencedOut, match="does not exist"):
        await run_store.finish_pending(new_run_id(), 1, INTERRUPTED)


async def test_claim_next_can_be_limited_to_given_runs(empty_stores: Stores) -> None:
    run_store, _ = empty_stores
    a = (await run_store.admit(run("t1"))).record
    b = (await run_store.admit(run("t2"))).record
    now = datetime.now(UTC)
    assert await run_store.claim_next("w", lease(), now, run_ids=[]) is None
    got = await run_store.claim_next("w", lease(), now, run_ids=[b.run_id])
    assert got is not None and got.run_id == b.run_id
    assert (await run_store.get(a.run_id)).status is RunStatus.pending  # type: ignore[union-attr]


async def test_the_end_is_journaled_with_the_completion_or_not_at_all(stores: Stores, tid: str) -> None:
    run_store, journal = stores
    await run_store.admit(run(tid))
    run_id = await claim_mine(stores, tid)
    end = JournalEvent(run_id, tid, 9, "run.end", {"status": "success"})
    await run_store.claim(run_id, "w2", lease(), attempt=1)
    with pytest.raises(FencedOut):
        await run_store.finish(run_id, 1, DONE, end)  # the lost attempt: no record, no end
    assert await journal.list(run_id) == []
    await run_store.finish(run_id, 2, DONE, end)
    assert [(e.seq, e.kind) for e in await journal.list(run_id)] == [(9, "run.end")]


async def test_the_thread_settles_with_the_completion_or_not_at_all(stores: Stores, tid: str) -> None:
    run_store, _ = stores
    run_id = (await run_store.admit(run(tid), StartClaim("w1", lease()))).record.run_id
    assert (await run_store.get_thread(tid)).status == "busy"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="thread status"):  # refused before anything is written
        await run_store.finish(run_id, 1, DONE, thread_status="asleep")
    await run_store.claim(run_id, "w2", lease(), attempt=1)
    with pytest.raises(FencedOut):
        await run_store.finish(run_id, 1, DONE, thread_status="idle")  # the lost attempt settles nothing
    assert (await run_store.get(run_id)).status is RunStatus.running  # type: ignore[union-attr]
    assert (await run_store.get_thread(tid)).status == "busy"  # type: ignore[union-attr]
    await run_store.finish(run_id, 2, DONE, thread_status="interrupted")
    assert (await run_store.get_thread(tid)).status == "interrupted"  # type: ignore[union-attr]
    # Without one, the thread is left as it is.
    other = (await run_store.admit(run(tid), StartClaim("w1", lease()))).record.run_id
    await run_store.finish(other, 1, DONE)
    assert (await run_store.get_thread(tid)).status == "busy"  # type: ignore[union-attr]
