"""A long, catastrophic ``grep`` inside a real ``keel serve``: the server keeps answering and a
SIGTERM still exits promptly.

The lead agent's scripted model calls ``grep`` with ``(a+)+$`` over ~70 MB of ``aaa…ab`` lines:
exponential per long line for a backtracking engine that holds the GIL (the server froze for ~18 s
on one such line and took 29 s to exit), linear with RE2 but still more work than the tool time
limit allows, so the call always lasts the whole limit. The probes are plain HTTP from another
process, as a load balancer's would be.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from server_support import run_reaches, sdk, start_server, write_project

from agentkeel.sandbox.workspace import Workspace

DRAIN_S = 2.0
EXIT_BOUND_S = DRAIN_S + 4.0  # drain, stop the tool, finalize, exit
TOOL_LIMIT_S = 5.0  # the grep below needs ~15 s here: it runs into this limit
PATTERN = "(a+)+$"
FILES = 8
BLOCK = ((b"aaaab\n" * 999) + b"a" * 28 + b"b\n") * 1500  # 9 MB, 1.5 M lines
GREP_SCRIPT: dict[str, Any] = {"agents": {"lead": [
    {"say": "Searching the data.", "tool_calls": [{"name": "grep", "args": {"pattern": PATTERN, "path": "/workspace/data"}}]},
    {"say": "The search ran out of time."},
]}}


def fill_workspace(data_dir: Path, thread_id: str) -> None:
    target = Workspace.for_thread(data_dir, thread_id).real_root / "data"
    target.mkdir()
    for index in range(FILES):
        (target / f"part{index}.txt").write_bytes(BLOCK)


async def probe(http: httpx.AsyncClient, stop: asyncio.Event) -> dict[str, float]:
    """The slowest answer of ``/ok`` and of ``/healthz`` until ``stop``; a probe that fails counts
    as infinitely slow."""
    worst = {"/ok": 0.0, "/healthz": 0.0}
    while not stop.is_set():
        for path in ("/ok", "/healthz"):
            begin = time.monotonic()
            try:
                answered = (await http.get(path, timeout=5)).json() == {"ok": True}
            except httpx.HTTPError:
                answered = False
            worst[path] = max(worst[path], time.monotonic() - begin if answered else float("inf"))
        await asyncio.sleep(0.05)
    return worst


async def test_catastrophic_grep_leaves_probes_answering_and_sigterm_prompt(tmp_path: Path) -> None:
    config = write_project(tmp_path, gateway={"drain_s": DRAIN_S}, limits={"workspace_tool_timeout_s": TOOL_LIMIT_S})
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(GREP_SCRIPT, sort_keys=False))
    server = start_server(config)
    try:
        async with sdk(server.url) as client, httpx.AsyncClient(base_url=server.url) as http:
            thread_id = (await client.threads.create())["thread_id"]
            await asyncio.to_thread(fill_workspace, tmp_path / "data", thread_id)
            run_input = {"messages": [{"role": "user", "content": "find it"}]}

            stop = asyncio.Event()
            probes = asyncio.create_task(probe(http, stop))
            begin = time.monotonic()
            run = await client.runs.create(thread_id, "lead", input=run_input)
            finished = await run_reaches(client, thread_id, run["run_id"], "success", "error", timeout=90)
            took = time.monotonic() - begin
            stop.set()
            worst = await probes
            assert finished["status"] == "success", finished
            messages = (await client.threads.get_state(thread_id))["values"]["messages"]
            results = [m["content"] for m in messages if m["type"] == "tool"]
            stopped = f"grep stopped after the {TOOL_LIMIT_S:g} s time limit of workspace tools"
            assert len(results) == 1 and results[0].startswith(f"[... stopped: {stopped}"), results
            print(f"grep run {took:.2f} s; slowest /ok {worst['/ok']:.3f} s, /healthz {worst['/healthz']:.3f} s")
            assert worst["/ok"] < 1.0 and worst["/healthz"] < 1.0, worst

            # The same grep again, SIGTERM while it runs: the drain (shorter than the tool limit)
            # cancels the run, which stops the grep's thread, and the process exits.
            run = await client.runs.create(thread_id, "lead", input=run_input)
            await run_reaches(client, thread_id, run["run_id"], "running", timeout=30)
            await asyncio.sleep(1.0)
            signalled = time.monotonic()
            server.signal(signal.SIGTERM)
        returncode = await asyncio.to_thread(server.wait, EXIT_BOUND_S + 30)
        elapsed = time.monotonic() - signalled
    finally:
        server.stop()
    print(f"SIGTERM during grep to exit: {elapsed:.2f} s (drain_s {DRAIN_S:g})")
    assert returncode == 0, server.output()
    assert elapsed < EXIT_BOUND_S, f"exit took {elapsed:.1f} s"
