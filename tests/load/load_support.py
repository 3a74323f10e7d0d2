"""A multi-process deployment for the load test and ``benchmarks/workers.py``.

Real ``keel worker`` and ``keel serve --no-worker`` processes share one PostgreSQL database and one
Redis (its keys under a prefix of their own), as a deployment's processes do; each is started by
the caller and stopped (or killed) by its PID, never by name.

The invariants are derived from what the processes recorded, not from what the test sent:
``running_intervals`` rebuilds, from the journal rows, when each attempt of each run held its
thread, so "one running run per thread" is checked against the timestamps the workers wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

# Fast turns with tool calls: ``ls`` is read-only, so a resumed run may repeat it safely.
SCRIPT: dict[str, Any] = {
    "strict": True,
    "agents": {
        "lead": [
            {"say": "Looking around.", "tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}],
             "delay_ms": 40},
            {"tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}], "delay_ms": 40},
            {"say": "Done.", "delay_ms": 20},
        ]
    },
}
ASSISTANTS = {"lead": "fail", "steady": "resume"}  # assistant_id -> on_worker_lost
STRATEGIES = ("reject", "interrupt", "rollback", "enqueue")
TERMINAL = {"success", "error", "timeout", "interrupted"}
_READY = re.compile(r"AgentKeel worker (\S+) ready")
_LISTENING = re.compile(r"AgentKeel gateway listening on (\S+)")
_OVERRIDING_ENV = ("AGENTKEEL_CONFIG", "AGENTKEEL_DATABASE_URL", "AGENTKEEL_REDIS_URL")


def write_config(root: Path, database: str, stream: str, prefix: str, lease_ttl_s: float = 3) -> Path:
    """One config for every process of the deployment (same database, Redis, prefix, data dir)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "script.yaml").write_text(yaml.safe_dump(SCRIPT, sort_keys=False))
    config = {
        "data_dir": str(root / "data"),
        "database": database,
        "stream": stream,
        "stream_prefix": prefix,
        "models": [{"name": "scripted", "use": "scripted", "script": "script.yaml"}],
        "assistants": [{"assistant_id": a, "model": "scripted", "on_worker_lost": p} for a, p in ASSISTANTS.items()],
        "limits": {"lease_ttl_s": lease_ttl_s, "stream_heartbeat_s": 1},
        "gateway": {"heartbeat_s": 1, "drain_s": 2},
    }
    path = root / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Proc:
    """One ``keel worker`` or ``keel serve --no-worker`` child."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    gateway: bool = False
    url: str = ""  # gateways only: where it listens, read from its ready line (it binds port 0)
    owner: str = ""  # workers only: the owner id it claims runs under, read from its ready line

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no drain, no finalization, no lease release — a crash."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self) -> None:
        """SIGTERM (once): the process drains, then exits."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def reap(self, timeout: float = 20.0) -> int:
        """Wait for the exit a :meth:`terminate` asked for; SIGKILL after ``timeout``."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        return int(self.process.returncode)

    def stop(self, timeout: float = 20.0) -> int:
        self.terminate()
        return self.reap(timeout)


def stop_all(procs: Iterable[Proc], timeout: float = 20.0) -> None:
    """Stop every process: all are signalled first, so they drain side by side, not one by one."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.reap(timeout)


def spawn(config: Path, kind: str, name: str, extra: Sequence[str] = ()) -> Proc:
    """Start ``keel worker`` (kind ``worker``) or ``keel serve --no-worker`` (kind ``gateway``),
    with ``extra`` arguments (``--metrics-port 0``)."""
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDING_ENV}
    env.setdefault("PYTHONUNBUFFERED", "1")
    base = [sys.executable, "-m", "agentkeel.cli"]
    if kind == "worker":
        command = [*base, "worker", "--config", str(config)]
    else:
        command = [*base, "serve", "--no-worker", "--config", str(config), "--host", "127.0.0.1", "--port", "0"]
    command += list(extra)
    log = config.parent / f"{name}.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=config.parent)
    return Proc(name=name, process=process, log=log, gateway=kind != "worker")


async def ready(proc: Proc, timeout: float = 60.0) -> Proc:
    """Return once the process serves: a worker printed its ready line, a gateway answers ``/ok``."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            if proc.process.poll() is not None:
                raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}:\n{proc.output()}")
            if not proc.gateway:
                match = _READY.search(proc.output())
                if match:
                    proc.owner = match.group(1)
                    return proc
            elif proc.url:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{proc.url}/ok")).status_code == 200:
                        return proc
            elif match := _LISTENING.search(proc.output()):
                proc.url = match.group(1)
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} not ready within {timeout:g} s:\n{proc.output()}")
            await asyncio.sleep(0.1)


async def start_all(config: Path, workers: int, gateways: int) -> tuple[list[Proc], list[Proc]]:
    """Start the processes side by side (each takes seconds, mostly imports) and wait for all."""
    procs = [spawn(config, "worker", f"worker-{i}") for i in range(workers)]
    procs += [spawn(config, "gateway", f"gateway-{i}") for i in range(gateways)]
    try:
        await asyncio.gather(*(ready(p) for p in procs))
    except BaseException:
        stop_all(procs, timeout=5)
        raise
    return procs[:workers], procs[workers:]


def user_input(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# -- what the processes recorded -----------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """One attempt of one run holding its thread: from its start (``run.start``, or the
    ``run.recovered`` that took the run over) to the record that ended it (``run.end``, or the
    ``run.recovered`` that fenced it out)."""

    thread_id: str
    run_id: str
    attempt: int
    start: datetime
    end: datetime | None  # None: nothing ended it (a run still holding its thread, or a lost record)


@dataclass
class JournalRow:
    run_id: str
    thread_id: str
    seq: int
    kind: str
    data: dict[str, Any]
    ts: datetime


def running_intervals(rows: Iterable[JournalRow]) -> list[Interval]:
    """Every attempt's interval, per run in ``seq`` order; see :class:`Interval`."""
    by_run: dict[str, list[JournalRow]] = defaultdict(list)
    for row in rows:
        by_run[row.run_id].append(row)
    intervals: list[Interval] = []
    for events in by_run.values():
        events.sort(key=lambda e: e.seq)
        open_: dict[int, tuple[datetime, JournalRow]] = {}
        for event in events:
            if event.kind == "run.start":
                attempt = int(event.data["attempt"])
                open_.setdefault(attempt, (event.ts, event))
            elif event.kind == "run.recovered":
                lost = int(event.data["lost_attempt"])
                if lost in open_:
                    start, first = open_.pop(lost)
                    intervals.append(Interval(first.thread_id, first.run_id, lost, start, event.ts))
                open_.setdefault(int(event.data["attempt"]), (event.ts, event))
            elif event.kind == "run.end":
                for attempt, (start, first) in sorted(open_.items()):
                    intervals.append(Interval(first.thread_id, first.run_id, attempt, start, event.ts))
                open_.clear()
        intervals += [Interval(first.thread_id, first.run_id, attempt, start, None)
                      for attempt, (start, first) in open_.items()]
    return intervals


def overlaps(intervals: Iterable[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of different runs of one thread that overlap in time (an open interval
    lasts forever). Intervals of the same run are one hold of the thread and may touch."""
    per_thread: dict[str, list[Interval]] = defaultdict(list)
    for interval in intervals:
        per_thread[interval.thread_id].append(interval)
    found: list[tuple[Interval, Interval]] = []
    for items in per_thread.values():
        items.sort(key=lambda i: i.start)
        latest: Interval | None = None  # the interval reaching furthest so far
        for item in items:
            if latest is not None and latest.run_id != item.run_id and (latest.end is None or latest.end > item.start):
                found.append((latest, item))
            if latest is None or (latest.end is not None and (item.end is None or item.end > latest.end)):
                latest = item
    return found


def seq_problems(rows: Iterable[JournalRow]) -> dict[str, str]:
    """Runs whose journal seqs are not exactly 1..n (a duplicate or a hole), with what is wrong."""
    seqs: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        seqs[row.run_id].append(row.seq)
    problems = {}
    for run_id, values in seqs.items():
        values.sort()
        if values != list(range(1, len(values) + 1)):
            dupes = sorted({v for v in values if values.count(v) > 1})
            holes = sorted(set(range(1, values[-1] + 1)) - set(values))
            problems[run_id] = f"duplicates {dupes[:5]}, holes {holes[:5]} of {values[-1]}"
    return problems


async def journal_rows(pg_url: str) -> list[JournalRow]:
    """Every journal row of the database, read directly (not through a gateway)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cursor = await conn.execute("SELECT run_id, thread_id, seq, kind, data, ts FROM journal")
        return [JournalRow(r[0], r[1], int(r[2]), r[3], _json(r[4]), r[5]) for r in await cursor.fetchall()]


async def run_rows(pg_url: str) -> dict[str, dict[str, Any]]:
    """run_id -> {thread_id, status, attempt, owner, stop_reasons, assistant_id} straight from the runs table."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cursor = await conn.execute(
            "SELECT run_id, thread_id, status, attempt, owner, stop_reasons, assistant_id FROM runs")
        return {r[0]: {"thread_id": r[1], "status": r[2], "attempt": r[3], "owner": r[4],
                       "stop_reasons": _json(r[5]), "assistant_id": r[6]} for r in await cursor.fetchall()}


def _json(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str) else value


async def delete_redis_keys(redis_url: str, prefix: str) -> int:
    from redis.asyncio import Redis

    client = Redis.from_url(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start:start + 500])
        return len(keys)
    finally:
        await client.aclose()


@dataclass
class Tally:
    """What the gateways answered, per strategy."""

    admitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STRATEGIES, 0))
    rejected: int = 0  # 409 under reject: the expected answer for a busy thread
    other: list[str] = field(default_factory=list)  # anything else: a failure
