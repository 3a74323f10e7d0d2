"""Runs outlive their owner: recovery (``on_worker_lost``), stored control requests, self-fencing.

A lost owner is simulated by claiming a run as a worker that never renews ("ghost"), with its
lease already expired; the real kill -9 of real processes is in
``tests/gateway/test_crash_recovery.py`` and ``tests/load/``. The runtimes here share a SQLite file
or the PostgreSQL database, as the processes of a deployment do.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_support import (
    FAST,
    Keel,
    _param,
    backend_matrix,
    call,
    data_events,
    finished,
    new_thread_id,
    start,
    stored,
    stream_events,
    thread_status,
    turn,
    wait_status,
    wait_until,
)

from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.records import MultitaskStrategy, RunStatus
from agentkeel.runtime.runtime import Runtime

SHARED = [_param("sqlite", "memory"), _param("postgres", "memory")]
GHOST = "ghost-host:1:deadbeef"  # another host: only its lease says whether it is alive


async def lose_owner(rt: Runtime, run_id: str) -> None:
    """Make ``run_id`` look like its owner died mid-run: claimed by a ghost whose lease expired."""
    past = datetime.now(UTC) - timedelta(seconds=5)
    claimed = await rt.store.claim_next(GHOST, past, datetime.now(UTC), run_ids=[run_id])
    assert claimed is not None and claimed.status is RunStatus.running


def counted(rt: Runtime, name: str, **labels: str) -> float:
    """One sample of the runtime's run metrics, read as Prometheus reads it."""
    for family in text_string_to_metric_families(rt.metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


async def recoveries(rt: Runtime, policy: str, outcome: str) -> float:
    """The recovery counter once it moved (it moves just after the durable record)."""
    labels = {"policy": policy, "outcome": outcome}
    return float(await wait_until(lambda: counted(rt, "agentkeel_lease_recoveries_total", **labels), 5, what=labels))


def config(keel: Keel, policy: str = "fail", **models: list[dict[str, Any]]) -> Any:
    return keel.config(
        models or {"fast": FAST},
        assistants=[{"assistant_id": "lead", "on_worker_lost": policy}],
        limits={"lease_ttl_s": 3},
    )


@backend_matrix(SHARED)
async def test_fail_policy_ends_a_lost_run_and_frees_its_thread(keel: Keel) -> None:
    cfg = config(keel)
    thread = new_thread_id("lost")
    async with keel.open(cfg, executes="none") as admitting:
        lost = await start(admitting, thread, "first")
        await lose_owner(admitting, lost.run_id)
        queued = await start(admitting, thread, "second", multitask_strategy=MultitaskStrategy.enqueue)
    async with keel.open(cfg) as rt:  # a live worker: its start-up sweep recovers the lost run
        record = await finished(rt, lost.run_id)
        assert record.status is RunStatus.error and record.stop_reason == "worker_lost"
        assert record.attempt == 2 and "WorkerLost" in (record.error or "")
        assert record.stop_reasons[-1]["data"]["lost_owner"] == GHOST
        items = await stream_events(rt, lost.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["worker_lost"]
        journal = await rt.journal.list(lost.run_id)
        assert [e.kind for e in journal][-3:] == ["run.recovered", "stop_reason", "run.end"]
        assert await recoveries(rt, "fail", "error") == 1  # counted by the process that recovered it
        assert counted(rt, "agentkeel_runs_finished_total", status="error", stop_reason="worker_lost") == 1
        # The thread is free again: the queued run runs to the end.
        assert (await finished(rt, queued.run_id)).status is RunStatus.success
        assert await thread_status(rt, thread) == "idle"


@backend_matrix(SHARED)
async def test_resume_policy_continues_a_lost_run_under_a_new_attempt(keel: Keel) -> None:
    cfg = config(keel, "resume", steps=[turn("Looking.", call("ls", path="/workspace")), turn("Resumed fine.")])
    thread = new_thread_id("resume")
    async with keel.open(cfg, executes="none") as admitting:
        lost = await start(admitting, thread, "go")
        await lose_owner(admitting, lost.run_id)
    async with keel.open(cfg) as rt:
        record = await finished(rt, lost.run_id)
        assert record.status is RunStatus.success, record.error
        assert record.attempt == 2
        assert await recoveries(rt, "resume", "resumed") == 1
        assert counted(rt, "agentkeel_lease_recoveries_total", policy="fail", outcome="error") == 0
        kinds = [e.kind for e in await rt.journal.list(lost.run_id)]
        assert kinds.index("run.recovered") < kinds.index("run.start")
        start_event = next(e for e in await rt.journal.list(lost.run_id) if e.kind == "run.start")
        assert start_event.data["resumed_from"] == 1 and start_event.data["attempt"] == 2


@backend_matrix(SHARED)
async def test_a_cancel_stored_for_a_dead_owner_is_completed_by_recovery(keel: Keel) -> None:
    cfg = config(keel, "resume")
    thread = new_thread_id("cancel-dead")
    async with keel.open(cfg, executes="none") as admitting:
        lost = await start(admitting, thread, "go")
        await lose_owner(admitting, lost.run_id)
        assert (await admitting.manager.cancel(lost.run_id)).value == "cancelled"
        assert (await stored(admitting, lost.run_id)).control is not None
    async with keel.open(cfg) as rt:
        record = await finished(rt, lost.run_id)
        assert record.status is RunStatus.interrupted
        assert record.stop_reason == "cancelled"  # the cancel came first: it is the primary reason
        assert {e["code"] for e in record.stop_reasons} == {"cancelled", "worker_lost"}
        assert await recoveries(rt, "fail", "interrupted") == 1  # a stored control request: fail, whatever the policy


@backend_matrix(SHARED)
async def test_a_worker_that_cannot_confirm_its_lease_stops_and_writes_nothing(
    keel: Keel, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = keel.config({"slow": [turn("Too late.", delay_ms=4000)]}, limits={"lease_ttl_s": 1})
    async with keel.open(cfg) as rt:
        async def unreachable(*_args: Any, **_kwargs: Any) -> None:
            raise ConnectionError("database unreachable")

        monkeypatch.setattr(rt.store, "renew_leases", unreachable)
        run = await start(rt, new_thread_id("fenced"), "hi")
        # The owner fences itself; the run is then recovered (by this same live process, once the
        # stored lease expired) and ends with the ownership reason, not as the old attempt saw it.
        record = await wait_status(rt, run.run_id, RunStatus.error, timeout=10)
        assert record.stop_reason == "worker_lost" and record.attempt == 2
        kinds = [e.kind for e in await rt.journal.list(run.run_id)]
        assert kinds.count("run.end") == 1  # only the recovery's: the fenced attempt wrote none
        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end


@backend_matrix(SHARED)
async def test_a_cancel_reaches_the_owner_in_another_runtime(keel: Keel) -> None:
    # A short lease: without a wake-up channel (SQLite) the owner learns of the request when it
    # next renews, every third of the lease.
    cfg = keel.config({"slow": [turn("Too late.", delay_ms=20_000)]}, limits={"lease_ttl_s": 3})
    async with keel.open(cfg) as worker, keel.open(cfg, executes="none") as gateway:
        run = await start(gateway, new_thread_id("remote-cancel"), "hi")
        await wait_status(gateway, run.run_id, RunStatus.running)
        assert worker.manager.active(run.run_id) is not None
        assert (await gateway.manager.cancel(run.run_id)).value == "cancelled"
        record = await finished(gateway, run.run_id, timeout=10)
        assert record.status is RunStatus.interrupted and record.stop_reason == "cancelled"
        assert record.stop_reasons[0]["source"] == "manager"


@backend_matrix([_param("postgres", "memory")])
@pytest.mark.parametrize("outcome", ["success", "error"])
async def test_postgres_backends_terminated_during_finalization(
    keel: Keel, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """Every server connection of the database dies as the completion is written (and the first
    write fails): the completion is retried until it lands; the run is never left ``running`` and
    never reported as a success it was not."""
    import psycopg

    last = turn("Done.") if outcome == "success" else {"raise": {"kind": "server_error", "message": "boom"}}
    cfg = keel.config({"m": [last]}, limits={"llm_retry": {"max_attempts": 1}})
    async with keel.open(cfg) as rt:
        original = rt.store.finish
        calls = 0

        async def finish_while_the_database_restarts(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                with psycopg.connect(keel.backend.database_url, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                raise ConnectionError("server closed the connection unexpectedly")
            return await original(*args, **kwargs)

        monkeypatch.setattr(rt.store, "finish", finish_while_the_database_restarts)
        run = await start(rt, new_thread_id("pgkill"), "hi")
        record = await finished(rt, run.run_id, timeout=20)
        assert calls >= 2
        assert record.status is (RunStatus.success if outcome == "success" else RunStatus.error)
        assert (await stored(rt, run.run_id)).status is record.status
        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end
