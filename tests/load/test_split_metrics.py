"""``/metrics`` of a split deployment: one ``keel serve --no-worker`` and two ``keel worker
--metrics-port 0`` processes on one database (SQLite; PostgreSQL with Redis), scraped with
prometheus_client's own text parser.

What each process says is checked against what the runs recorded: the worker that executed a run
counts its tokens per model call — after the first call and before the second, mid-run — and the
same totals once it ended (nothing added at END, nothing counted by the other worker or the
gateway); the gateway counts the admissions and the store's live runs and executes nothing; a
worker killed with SIGKILL mid-run has its run recovered under ``on_worker_lost: fail`` by the
survivor, which counts the recovery (policy and outcome) and the run it ended. Both workers' stop
signals are still theirs: SIGTERM drains and exits 0 with the endpoint up.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from load_support import Proc, delete_redis_keys, ready, spawn
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

FIRST, SECOND = {"input": 111, "output": 11}, {"input": 222, "output": 22}
SCRIPTS: dict[str, Any] = {
    # Two model calls; the second answers only after a pause, so the first one's tokens can be read
    # while the run is still running.
    "steps": {"agents": {"lead": [
        {"say": "Looking.", "tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}], "usage": FIRST},
        {"say": "Done.", "usage": SECOND, "delay_ms": 4000},
    ]}},
    "stall": {"agents": {"lead": [{"say": "Still thinking.", "delay_ms": 120_000}]}},
}
_METRICS_LINE = re.compile(r"AgentKeel worker metrics on (\S+)/metrics")


def project(root: Path, database: str, stream: str, prefix: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, script in SCRIPTS.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(script, sort_keys=False))
    config = {
        "data_dir": str(root / "data"), "database": database, "stream": stream, "stream_prefix": prefix,
        "models": [{"name": name, "use": "scripted", "script": f"{name}.yaml"} for name in SCRIPTS],
        "assistants": [
            {"assistant_id": "lead", "model": "steps"},
            {"assistant_id": "staller", "model": "stall", "on_worker_lost": "fail"},
        ],
        "limits": {"lease_ttl_s": 3, "stream_heartbeat_s": 1},
        "gateway": {"heartbeat_s": 1, "drain_s": 2},
    }
    path = root / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.redis])])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    prefix = f"metrics-{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        yield project(tmp_path, f"sqlite:///{tmp_path / 'keel.db'}", "memory", prefix)
        return
    redis_url = request.getfixturevalue("redis_url")
    yield project(tmp_path, request.getfixturevalue("fresh_pg_url"), redis_url, prefix)
    asyncio.run(delete_redis_keys(redis_url, prefix))


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def tokens(samples: Samples, direction: str) -> float:
    return value(samples, "agentkeel_tokens_total", caller="lead", model="steps", direction=direction)


async def poll(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := await check():
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Deployment:
    def __init__(self, http: httpx.AsyncClient, gateway: Proc, workers: list[Proc]) -> None:
        self.http, self.gateway = http, gateway
        self.workers = {w.owner: w for w in workers}
        self.metrics_url = {w.owner: _METRICS_LINE.search(w.output()).group(1) for w in workers}  # type: ignore[union-attr]

    async def scrape(self, owner: str | None = None) -> Samples:
        """A worker's metrics (by owner), or the gateway's."""
        url = f"{self.metrics_url[owner]}/metrics" if owner else f"{self.gateway.url}/metrics"
        answer = await self.http.get(url)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
        return parse(answer.text)

    async def start_run(self, assistant: str) -> str:
        thread = (await self.http.post(f"{self.gateway.url}/threads", json={})).json()["thread_id"]
        run = (await self.http.post(f"{self.gateway.url}/threads/{thread}/runs", json={
            "assistant_id": assistant, "input": {"messages": [{"role": "user", "content": "go"}]}})).json()
        return f"{self.gateway.url}/threads/{thread}/runs/{run['run_id']}"

    async def record(self, run: str) -> dict[str, Any]:
        return dict((await self.http.get(run)).json())

    async def owner_of(self, run: str) -> str:
        """The worker executing the run, as its journal's ``run.start`` names it."""
        async def claimed() -> str | None:
            events = (await self.http.get(f"{run}/journal")).json()
            return next((e["data"]["owner"] for e in events if e["kind"] == "run.start"), None)

        return str(await poll(claimed, 30, "a worker to start the run"))

    async def ended(self, run: str, timeout: float = 30) -> dict[str, Any]:
        async def terminal() -> dict[str, Any] | None:
            record = await self.record(run)
            return record if record["status"] not in ("pending", "running") else None

        return dict(await poll(terminal, timeout, "the run to end"))


async def test_split_deployment_exports_what_each_process_did(config: Path) -> None:
    procs = [spawn(config, "gateway", "gateway"), *(
        spawn(config, "worker", f"worker-{i}", ["--metrics-port", "0"]) for i in range(2))]
    try:
        gateway, *workers = await asyncio.gather(*(ready(p) for p in procs))
        async with httpx.AsyncClient(timeout=10) as http:
            deployment = Deployment(http, gateway, workers)
            await check_tokens_move_per_model_call(deployment)
            await check_a_recovery_under_fail_is_counted(deployment)
    finally:
        codes = {p.name: p.stop() for p in procs if p.process.poll() is None}
    assert all(code == 0 for code in codes.values()), {p.name: p.output() for p in procs}


async def check_tokens_move_per_model_call(d: Deployment) -> None:
    before = {owner: await d.scrape(owner) for owner in d.workers}
    gateway_before = await d.scrape()
    for owner in d.workers:
        health = (await d.http.get(f"{d.metrics_url[owner]}/healthz")).json()
        assert health == {"ok": True, "owner": owner, "draining": False}

    run = await d.start_run("lead")
    owner = await d.owner_of(run)
    other = next(o for o in d.workers if o != owner)

    async def first_call_counted() -> Samples | None:
        samples = await d.scrape(owner)
        return samples if tokens(samples, "input") > tokens(before[owner], "input") else None

    mid = await poll(first_call_counted, 20, "the first model call's tokens")
    assert (await d.record(run))["status"] == "running"  # the second call has not answered yet
    for direction in ("input", "output"):
        assert tokens(mid, direction) - tokens(before[owner], direction) == FIRST[direction]

    record = await d.ended(run)
    assert record["status"] == "success", record
    after = await d.scrape(owner)
    for direction in ("input", "output"):  # the run's end added nothing: no double count
        moved = tokens(after, direction) - tokens(before[owner], direction)
        assert moved == FIRST[direction] + SECOND[direction] == record["usage"]["by_agent"]["lead"][f"{direction}_tokens"]
        assert tokens(await d.scrape(other), direction) == tokens(before[other], direction)
    success = {"status": "success", "stop_reason": "none"}
    assert value(after, "agentkeel_runs_finished_total", **success) == value(before[owner], "agentkeel_runs_finished_total", **success) + 1
    assert value(after, "agentkeel_runs_created_total") == 0  # admissions are the gateway's

    gateway_after = await d.scrape()
    assert value(gateway_after, "agentkeel_runs_created_total") == value(gateway_before, "agentkeel_runs_created_total") + 1
    assert value(gateway_after, "agentkeel_admission_seconds_count") == value(gateway_before, "agentkeel_admission_seconds_count") + 1
    assert tokens(gateway_after, "input") == 0  # it executed nothing
    assert value(gateway_after, "agentkeel_runs_finished_total", **success) == 0


async def check_a_recovery_under_fail_is_counted(d: Deployment) -> None:
    run = await d.start_run("staller")
    victim = await d.owner_of(run)
    survivor = next(o for o in d.workers if o != victim)
    live = await d.scrape()  # the gateway reads the store's live runs, wherever they execute
    assert value(live, "agentkeel_store_runs", status="running") == 1
    assert value(live, "agentkeel_store_runs", status="pending") == 0
    assert value(await d.scrape(victim), "agentkeel_runs_active") == 1
    before = await d.scrape(survivor)

    d.workers[victim].kill()
    record = await d.ended(run)
    assert (record["status"], record["stop_reason"]) == ("error", "worker_lost"), record

    async def counted() -> Samples | None:  # the survivor counts after the durable record
        samples = await d.scrape(survivor)
        return samples if value(samples, "agentkeel_lease_recoveries_total", policy="fail", outcome="error") else None

    after = await poll(counted, 10, "the recovery to be counted")
    moved = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert moved("agentkeel_lease_recoveries_total", policy="fail", outcome="error") == 1
    assert moved("agentkeel_lease_recoveries_total", policy="resume", outcome="resumed") == 0
    assert moved("agentkeel_runs_finished_total", status="error", stop_reason="worker_lost") == 1
    assert value(await d.scrape(), "agentkeel_store_runs", status="running") == 0
