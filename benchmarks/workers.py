"""Throughput and dispatch latency with 1 and with 2 ``keel worker`` processes behind one gateway.

Each configuration is a fresh deployment on this machine: one ``keel serve --no-worker`` and N
``keel worker`` processes sharing a new PostgreSQL database (created on ``--pg-admin``'s server,
dropped afterwards) and Redis (keys under a prefix of their own, deleted afterwards). The agent is
the scripted model of ``tests/load/load_support.py`` (three short turns, two ``ls`` calls). The
configurations run one after the other in the same invocation, alternating when ``--rounds`` > 1,
so the ratio compares them on the same machine at the same time.

Per configuration:

a. ``--runs`` runs over ``--threads`` threads (``enqueue``), posted as fast as the gateway takes
   them (16 requests in flight). **runs/s** = runs / (last ``ended_at`` − first ``created_at``),
   both from the runs table (server clock).
b. **first event**: while (a) runs, ``--probes`` runs on fresh threads through
   ``POST /threads/{t}/runs/stream``, one after the other: time from sending the POST to the first
   SSE event a worker produced (the first after the gateway's ``metadata`` frame). With the
   default sizes every probe runs while (a) is still executing.
c. **start lag** of the runs of (a), from the journal: ``run.start`` minus the moment the run could
   start (its admission, or the ``run.end`` of the run before it on its thread): how long a
   startable run waited for a worker.

Run ``python benchmarks/workers.py [--runs 300] [--threads 50] [--probes 20] [--rounds 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "load"))
sys.path.insert(0, str(REPO / "benchmarks"))
from load_support import (  # type: ignore[import-not-found]  # noqa: E402
    delete_redis_keys,
    journal_rows,
    start_all,
    stop_all,
    user_input,
    write_config,
)

from gateway import read_stream  # type: ignore[import-not-found]  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"
IN_FLIGHT = 16


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def scratch_database(admin: str, name: str, create: bool) -> str:
    """Create (or drop) database ``name`` on ``admin``'s server; its URL."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        if create:
            await conn.execute(f'CREATE DATABASE "{name}"')
        else:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return f"{admin.rsplit('/', 1)[0]}/{name}"


async def _times(pg_url: str) -> dict[str, tuple[str, Any, Any, str]]:
    """run_id -> (thread_id, created_at, ended_at, status)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cursor = await conn.execute("SELECT run_id, thread_id, created_at, ended_at, status FROM runs")
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in await cursor.fetchall()}


async def _settled(pg_url: str, run_ids: set[str], timeout: float) -> dict[str, tuple[str, Any, Any, str]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = await _times(pg_url)
        if all(rows.get(r, ("", 0, 0, "pending"))[3] not in ("pending", "running") for r in run_ids):
            return rows
        if time.monotonic() > deadline:
            raise RuntimeError(f"runs still active after {timeout:g} s")
        await asyncio.sleep(0.2)


async def _post_all(http: httpx.AsyncClient, runs: int, threads: int, tag: str) -> list[str]:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def post(i: int) -> str:
        async with gate:
            response = await http.post(f"/threads/{tag}-{i % threads}/runs", json={
                "assistant_id": "lead", "input": user_input("go"), "multitask_strategy": "enqueue",
                "if_not_exists": "create"})
            response.raise_for_status()
            return str(response.json()["run_id"])

    return list(await asyncio.gather(*(post(i) for i in range(runs))))


async def _probe(http: httpx.AsyncClient, tag: str, count: int) -> list[float]:
    """``count`` streamed runs on fresh threads, one after the other, started with the load."""
    firsts: list[float] = []
    for i in range(count):
        body = {"assistant_id": "lead", "input": user_input("probe"), "stream_mode": ["values"],
                "if_not_exists": "create"}
        result = await read_stream(http, "POST", f"/threads/{tag}-probe-{i}/runs/stream", json_body=body)
        worker_frames = [f for f in result.frames if f.event != "metadata"]
        if worker_frames:
            firsts.append(worker_frames[0].at - result.started)
    return firsts


def start_lags(journal: list[Any], rows: dict[str, tuple[str, Any, Any, str]], run_ids: set[str]) -> list[float]:
    """Seconds each run waited between becoming startable and its first ``run.start``."""
    starts: dict[str, Any] = {}
    ends: dict[str, Any] = {}
    for row in journal:
        if row.kind == "run.start":
            starts.setdefault(row.run_id, row.ts)
        elif row.kind == "run.end":
            ends[row.run_id] = row.ts
    per_thread: dict[str, list[str]] = defaultdict(list)
    for run_id in run_ids:
        if run_id in starts:
            per_thread[rows[run_id][0]].append(run_id)
    lags = []
    for items in per_thread.values():
        items.sort(key=lambda r: starts[r])
        previous_end = None
        for run_id in items:
            ready_at = rows[run_id][1] if previous_end is None else max(rows[run_id][1], previous_end)
            lags.append((starts[run_id] - ready_at).total_seconds())
            previous_end = ends.get(run_id)
    return lags


async def measure(workers: int, runs: int, threads: int, probes: int, pg_admin: str, redis: str) -> dict[str, Any]:
    name = f"keel_bench_{uuid.uuid4().hex[:10]}"
    prefix = f"keelbench:{uuid.uuid4().hex[:10]}"
    pg_url = await scratch_database(pg_admin, name, create=True)
    try:
        with tempfile.TemporaryDirectory(prefix="keel-workers-bench-") as tmp:
            config = write_config(Path(tmp), pg_url, redis, prefix, lease_ttl_s=30)
            procs, gateways = await start_all(config, workers=workers, gateways=1)
            try:
                async with httpx.AsyncClient(base_url=gateways[0].url, timeout=120) as http:
                    warm = await _post_all(http, 2 * workers, 2 * workers, "warm")  # every worker builds once
                    await _settled(pg_url, set(warm), 120)
                    posting = asyncio.create_task(_post_all(http, runs, threads, "load"))
                    firsts = await _probe(http, "load", probes)
                    run_ids = set(await posting)
                    rows = await _settled(pg_url, run_ids, 600)
                journal = await journal_rows(pg_url)
            finally:
                stop_all([*procs, *gateways])
    finally:
        await scratch_database(pg_admin, name, create=False)
        await delete_redis_keys(redis, prefix)
    created = min(rows[r][1] for r in run_ids)
    ended = max(rows[r][2] for r in run_ids)
    lags = start_lags(journal, rows, run_ids)
    statuses = {rows[r][3] for r in run_ids}
    wall = (ended - created).total_seconds()
    return {
        "workers": workers, "runs": runs, "wall_s": wall, "runs_per_s": runs / wall, "statuses": statuses,
        "first_event_ms": [f * 1000 for f in firsts], "start_lag_ms": [lag * 1000 for lag in lags],
    }


def report(results: list[dict[str, Any]]) -> str:
    best: dict[int, dict[str, Any]] = {}
    for result in results:  # best round per configuration: other load on the machine only adds time
        if result["workers"] not in best or result["runs_per_s"] > best[result["workers"]]["runs_per_s"]:
            best[result["workers"]] = result
    out = ["| workers | runs | wall s | runs/s | first event p50 ms | p99 ms | start lag p50 ms | p99 ms |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workers in sorted(best):
        r = best[workers]
        fe, lag = r["first_event_ms"], r["start_lag_ms"]
        out.append(f"| {workers} | {r['runs']} | {r['wall_s']:.1f} | {r['runs_per_s']:.1f} | "
                   f"{pct(fe, 0.5):.0f} | {pct(fe, 0.99):.0f} | {pct(lag, 0.5):.0f} | {pct(lag, 0.99):.0f} |")
    if 1 in best and 2 in best:
        out.append(f"\nruns/s with 2 workers / with 1: {best[2]['runs_per_s'] / best[1]['runs_per_s']:.2f}x")
    samples = {w: (len(r["first_event_ms"]), len(r["start_lag_ms"])) for w, r in best.items()}
    out.append(f"samples (first events, start lags) per configuration: {samples}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--probes", type=int, default=20, help="streamed runs timed to their first event")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the configurations this many times")
    parser.add_argument("--pg-admin", default=PG_ADMIN, help="a database URL on the server to create scratch databases on")
    parser.add_argument("--redis", default=REDIS)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.workers.split(",")]
    results = []
    for round_ in range(args.rounds):
        for workers in counts:
            print(f"round {round_ + 1}: {workers} worker(s) ...", file=sys.stderr)
            results.append(asyncio.run(measure(workers, args.runs, args.threads, args.probes, args.pg_admin, args.redis)))
    print(report(results))
    return results


if __name__ == "__main__":
    main()
