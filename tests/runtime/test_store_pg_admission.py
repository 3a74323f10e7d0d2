"""Admission is serialised by the database, not by the process: two OS processes race on one thread.

Each process opens its own stores on the shared database, warms its connection pool, signals
ready and waits at a file barrier; then all of its admissions fire at once. With ``reject`` exactly
one of the 50 may win. With ``enqueue`` (a second thread, in the same burst) all 50 win and
``queue_seq`` numbers them 1..50 without a gap or a duplicate, which only holds if each admission
takes the per-thread max+1 under the thread's lock.

The workers come from a ``forkserver`` that imported the stores once: fresh processes (no inherited
event loop, threads or connections) without paying the import per process.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agentkeel.database import Database
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.records import ConflictError, MultitaskStrategy, RunRecord, new_run_id
from agentkeel.runtime.stores.factory import open_stores

PROCESSES = 2
PER_PROCESS = 25
STRATEGIES = (MultitaskStrategy.reject, MultitaskStrategy.enqueue)


def _tally(results: list[Any]) -> dict[str, Any]:
    errors = [r for r in results if isinstance(r, BaseException)]
    return {
        "admitted": len(results) - len(errors),
        "conflicts": sum(isinstance(r, ConflictError) for r in errors),
        "errors": [repr(r) for r in errors if not isinstance(r, ConflictError)],
    }


async def _burst(url: str, threads: dict[str, str], ready: Path, barrier: Path) -> dict[str, Any]:
    async with open_connections(Database.parse(url)) as connections:
        run_store = (await open_stores(connections)).runs
        await asyncio.gather(*(run_store.get("warm-up") for _ in range(PER_PROCESS)))
        ready.touch()
        while not barrier.exists():
            await asyncio.sleep(0.001)
        records = [
            RunRecord(new_run_id(), threads[s], "lead", multitask_strategy=s)
            for s in STRATEGIES
            for _ in range(PER_PROCESS)
        ]
        results = await asyncio.gather(
            *(run_store.admit(r) for r in records), return_exceptions=True
        )
    return {
        s.value: _tally(results[i * PER_PROCESS : (i + 1) * PER_PROCESS])
        for i, s in enumerate(STRATEGIES)
    }


def _worker(url: str, threads: dict[str, str], ready: Path, barrier: Path, out: Path) -> None:
    out.write_text(json.dumps(asyncio.run(_burst(url, threads, ready, barrier))))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared.db"
    # A database of this module's own: the race leaves 51 pending runs, which a later runtime
    # test's worker on a shared database would claim.
    return str(request.getfixturevalue("module_pg_url"))


async def race(url: str, threads: dict[str, str], workdir: Path) -> list[dict[str, Any]]:
    """Start the processes, release them together, and collect each one's tally per strategy."""
    context = multiprocessing.get_context("forkserver")
    # Named by module, not ``__name__``: Python 3.11's forkserver ignores the test's sys.path.
    context.set_forkserver_preload([open_stores.__module__, pytest.__name__])
    barrier = workdir / "go"
    slots = [(workdir / f"ready-{i}", workdir / f"tally-{i}.json") for i in range(PROCESSES)]
    procs = [
        context.Process(target=_worker, args=(url, threads, ready, barrier, out), daemon=True)
        for ready, out in slots
    ]
    for proc in procs:
        proc.start()
    try:
        async with asyncio.timeout(60):
            while not all(ready.exists() for ready, _ in slots):
                assert all(p.is_alive() for p in procs), "a worker died before the race"
                await asyncio.sleep(0.01)
            barrier.touch()
            for proc in procs:
                await asyncio.to_thread(proc.join)
    finally:
        for proc in procs:
            proc.kill()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return [json.loads(out.read_text()) for _, out in slots]


async def rows(url: str, thread_id: str) -> list[tuple[str, int]]:
    async def work(conn: AsyncConnection) -> list[tuple[str, int]]:
        result = await conn.execute(
            text("SELECT status, queue_seq FROM runs WHERE thread_id = :t ORDER BY queue_seq"),
            {"t": thread_id},
        )
        return [(status, seq) for status, seq in result]

    async with open_connections(Database.parse(url)) as connections:
        assert connections.sql is not None
        return await connections.sql.transaction(work)


async def test_admission_races_between_two_processes(shared_url: str, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    threads = {s.value: f"{s.value}-{suffix}" for s in STRATEGIES}
    tallies = await race(shared_url, threads, tmp_path)
    total = PROCESSES * PER_PROCESS

    assert [t[s]["errors"] for t in tallies for s in threads] == [[]] * (PROCESSES * 2)
    assert sum(t["reject"]["admitted"] for t in tallies) == 1
    assert sum(t["reject"]["conflicts"] for t in tallies) == total - 1
    assert await rows(shared_url, threads["reject"]) == [("pending", 1)]

    assert sum(t["enqueue"]["admitted"] for t in tallies) == total
    enqueued = await rows(shared_url, threads["enqueue"])
    assert [seq for _, seq in enqueued] == list(range(1, total + 1))
