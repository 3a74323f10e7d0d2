"""A real ``keel serve`` killed with SIGKILL in the middle of a tool call, or right after its
admissions answered, then started again.

What an operator sees afterwards, under both ``on_worker_lost`` policies: the run is terminal
within the lease (the restarted process finds its own dead runs at once: same host, pid gone), the
thread takes a new run, an observer that reconnects with its ``Last-Event-ID`` gets END with no
event id repeated (a stretch it cannot get back is announced as a ``gap``), the journal holds what
happened before the crash, and a non-idempotent tool that was in flight is not executed again.

The tool is ``bash``: it records that it started, sleeps, then appends one line. Its sandbox dies
with the killed server, so the line is never appended: a line could only come from a command that
outlived the server or from the tool being run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from server_support import KeelServer, start_server, write_project

TOOL_S = 3  # how long the tool sleeps between its two lines
BASH = f"echo started >> starts.txt; sleep {TOOL_S}; echo once >> count.txt"
SCRIPT = {"agents": {"lead": [
    {"say": "Appending the line.", "tool_calls": [{"name": "bash", "args": {"command": BASH}}]},
    {"say": "Checked: the line is there."},
]}}


def project(root: Path, policy: str, database: str | None = None, stream: str = "memory") -> Path:
    config = write_project(
        root, database=database, stream=stream, limits={"lease_ttl_s": 3}, gateway={"end_event": True}
    )
    raw = yaml.safe_load(config.read_text())
    raw["stream_prefix"] = f"crash-{root.name}"
    (root / "crash.yaml").write_text(yaml.safe_dump(SCRIPT, sort_keys=False))
    raw["models"].insert(0, {"name": "crash", "use": "scripted", "script": "crash.yaml"})
    raw["assistants"] = [{"assistant_id": "lead", "model": "crash", "on_worker_lost": policy}]
    raw["tools"] = {"bash": True}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


async def follow(url: str, path: str, seen: list[dict[str, Any]], last_event_id: str | None = None) -> None:
    """Append every SSE event of ``path`` to ``seen`` until the stream ends or breaks."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, read=60)) as http:
        with contextlib.suppress(httpx.HTTPError):
            async with http.stream("GET", path, headers=headers) as response:
                event: dict[str, Any] = {}
                async for line in response.aiter_lines():
                    if not line:
                        if event:
                            seen.append(event)
                        event = {}
                    elif line.startswith("id:"):
                        event["id"] = line[3:].strip()
                    elif line.startswith("event:"):
                        event["event"] = line[6:].strip()
                    elif line.startswith("data:"):
                        event["data"] = line[5:].strip()


async def poll(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def seq(event: dict[str, Any]) -> int:
    return int(event["id"].split("-")[0])


@pytest.fixture(params=["sqlite-memory", pytest.param("postgres-redis", marks=[pytest.mark.postgres, pytest.mark.redis])])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str | None, str]]:
    """(database, stream) of the deployment: the embedded default, or PostgreSQL + Redis."""
    if request.param == "sqlite-memory":
        yield None, "memory"
        return
    import redis

    redis_url = request.getfixturevalue("redis_url")
    yield request.getfixturevalue("fresh_pg_url"), redis_url
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"crash-{tmp_path.name}:*"):
        client.delete(key)
    client.close()


@pytest.mark.parametrize("policy", ["fail", "resume"])
async def test_kill_9_mid_tool_then_restart(tmp_path: Path, policy: str, backend: tuple[str | None, str]) -> None:
    config = project(tmp_path, policy, *backend)
    workspace_of = lambda thread: tmp_path / "data" / "threads" / thread / "workspace"  # noqa: E731
    server: KeelServer = start_server(config)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = (await http.post("/threads", json={})).json()["thread_id"]
            run = (await http.post(f"/threads/{thread}/runs", json={
                "assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "append"}]},
                "stream_mode": ["values", "updates"], "stream_resumable": True,
            })).json()
            run_path = f"/threads/{thread}/runs/{run['run_id']}"
            first: list[dict[str, Any]] = []
            observer = asyncio.create_task(follow(server.url, f"{run_path}/stream", first, "-1"))
            starts = workspace_of(thread) / "starts.txt"
            await poll(lambda: asyncio.sleep(0, starts.exists()), 20, "the tool to start")
            tool_started = time.monotonic()
            await asyncio.sleep(0.5)  # past the journal's flush interval
        server.signal(signal.SIGKILL)
        server.wait(10)
        await asyncio.wait_for(observer, 10)  # the connection broke with the process
    finally:
        if server.process.poll() is None:
            server.signal(signal.SIGKILL)

    restarted = start_server(config)
    try:
        async with httpx.AsyncClient(base_url=restarted.url, timeout=30) as http:
            began = time.monotonic()

            async def terminal() -> dict[str, Any] | None:
                record = (await http.get(run_path)).json()
                return record if record["status"] not in ("pending", "running") else None

            record = await poll(terminal, 3 + 10, "the lost run to end")  # lease + grace
            assert time.monotonic() - began < 13
            assert record["attempt"] == 2
            if policy == "fail":
                assert record["status"] == "error" and record["stop_reason"] == "worker_lost"
            else:
                assert record["status"] == "success", record
                state = (await http.get(f"/threads/{thread}/state")).json()
                tool_results = [m for m in state["values"]["messages"] if m["type"] == "tool"]
                assert len(tool_results) == 1 and "is unknown" in tool_results[0]["content"]

            # An observer reconnecting where it was cut off gets the rest, and END.
            last_id = next((e["id"] for e in reversed(first) if e.get("id")), "-1")
            rest: list[dict[str, Any]] = []
            await asyncio.wait_for(follow(restarted.url, f"{run_path}/stream", rest, last_id), 20)
            ids = [seq(e) for e in first + rest if e.get("id")]
            assert ids == sorted(set(ids)), "an event id was repeated or went backwards"
            names = [e.get("event") for e in rest]
            assert names and names[-1] == "end"
            resumed_ids = [seq(e) for e in rest if e.get("id")]
            if resumed_ids and first and resumed_ids[0] != seq(first[-1]) + 1:
                assert "gap" in names  # a stretch that cannot be replayed is announced

            journal = (await http.get(f"{run_path}/journal")).json()
            kinds = [e["kind"] for e in journal]
            pre_crash = kinds[: kinds.index("run.recovered")]
            assert {"run.start", "model.call", "tool.intent"} <= set(pre_crash)
            seqs = [e["seq"] for e in journal]
            assert seqs == sorted(set(seqs))

            # Long enough for a command that outlived the server to append: until TOOL_S (and a
            # margin) after it started, which the restart has mostly used up. A re-run command
            # would have appended before the run could end (resume), or not run at all (fail).
            await asyncio.sleep(max(0.0, tool_started + TOOL_S + 0.5 - time.monotonic()))
            started = (workspace_of(thread) / "starts.txt").read_text().splitlines()
            if policy == "resume":
                assert started == ["started"], "the non-idempotent tool call was executed again"
            assert not (workspace_of(thread) / "count.txt").exists(), "the command outlived the server"

            # The thread is usable: a new run completes on it.
            again = await http.post(f"/threads/{thread}/runs/wait", json={
                "assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "again"}]},
            })
            assert again.status_code == 200
            assert (await http.get(f"/threads/{thread}")).json()["status"] in ("idle", "error")
    finally:
        assert restarted.stop() == 0, restarted.output()



async def test_kill_9_right_after_admissions_then_restart(tmp_path: Path, backend: tuple[str | None, str]) -> None:
    """Killed the moment its admissions answered: runs claimed by their own admission, killed
    before or just as they started (which, for a given run, is not controlled: a run may have
    journaled nothing yet). After a restart none is left running, each ends ``worker_lost`` with
    END, and each thread takes a new run."""
    config = project(tmp_path, "fail", *backend)
    body = {"assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "append"}]}}
    server: KeelServer = start_server(config)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            threads = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(4)]
            answers = await asyncio.gather(*(http.post(f"/threads/{t}/runs", json=body) for t in threads))
        server.signal(signal.SIGKILL)
        server.wait(10)
    finally:
        if server.process.poll() is None:
            server.signal(signal.SIGKILL)
    runs = [a.json() for a in answers]
    assert [r["status"] for r in runs] == ["running"] * 4  # each claimed by its admission

    restarted = start_server(config)
    try:
        async with httpx.AsyncClient(base_url=restarted.url, timeout=30) as http:
            for thread, run in zip(threads, runs, strict=True):
                run_path = f"/threads/{thread}/runs/{run['run_id']}"

                async def terminal(path: str = run_path) -> dict[str, Any] | None:
                    record = (await http.get(path)).json()
                    return record if record["status"] not in ("pending", "running") else None

                record = await poll(terminal, 3 + 10, f"run {run['run_id']} to end")  # lease + grace
                assert record["status"] == "error" and record["stop_reason"] == "worker_lost", record
                events: list[dict[str, Any]] = []
                await asyncio.wait_for(follow(restarted.url, f"{run_path}/stream", events, "-1"), 20)
                assert events and events[-1].get("event") == "end"
                journal = [e["kind"] for e in (await http.get(f"{run_path}/journal")).json()]
                assert journal[-3:] == ["run.recovered", "stop_reason", "run.end"]
            again = await http.post(f"/threads/{threads[0]}/runs", json=body)
            assert again.status_code == 200 and again.json()["status"] == "running"  # the thread is free
            await http.post(f"/threads/{threads[0]}/runs/{again.json()['run_id']}/cancel?wait=1")
    finally:
        assert restarted.stop() == 0, restarted.output()
