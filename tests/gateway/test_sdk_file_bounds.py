"""``read_file`` of a 1 GiB file inside a real ``keel serve``: the server's peak memory barely moves.

On the earlier code this took the server from ~130 MB to 2.2 GB RSS. The file is sparse (created
with truncate), starts with a text line and is then one endless line of NUL bytes; the scripted
model reads it whole, and the run's own ``limits.file_read_max_bytes`` decides where it is cut, which
also shows the limit reaches the tools from the config file. The peak is the server's ``VmHWM``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from server_support import run_reaches, sdk, start_server, write_project

from agentkeel.sandbox.workspace import Workspace

GIB = 1 << 30
READ_CAP = 5_000
READ_SCRIPT: dict[str, Any] = {"agents": {"lead": [
    {"say": "Reading the log.", "tool_calls": [{"name": "read_file", "args": {"path": "/workspace/huge.log"}}]},
    {"say": "Read it."},
]}}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


async def test_reading_a_1_gib_file_keeps_the_server_small(tmp_path: Path) -> None:
    config = write_project(tmp_path, limits={"file_read_max_bytes": READ_CAP})
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(READ_SCRIPT, sort_keys=False))
    server = start_server(config)
    try:
        async with sdk(server.url) as client:
            thread_id = (await client.threads.create())["thread_id"]
            huge = Workspace.for_thread(tmp_path / "data", thread_id).real_root / "huge.log"
            with huge.open("wb") as handle:
                handle.write(b"first line\n" + b"x" * 20_000 + b"\n")
                handle.truncate(GIB)
            before = peak_rss_mib(server.pid)
            begin = time.monotonic()
            run = await client.runs.create(thread_id, "lead", input={"messages": [{"role": "user", "content": "read"}]})
            finished = await run_reaches(client, thread_id, run["run_id"], "success", "error", timeout=90)
            took = time.monotonic() - begin
            after = peak_rss_mib(server.pid)
            assert finished["status"] == "success", finished
            messages = (await client.threads.get_state(thread_id))["values"]["messages"]
            results = [m["content"] for m in messages if m["type"] == "tool"]
            assert len(results) == 1 and results[0].startswith("first line\n"), results
            assert f"[... cut at {READ_CAP} bytes (limits.file_read_max_bytes)" in results[0]
    finally:
        server.stop()
    print(f"read_file of 1 GiB: {took:.2f} s; server peak RSS {before:.0f} -> {after:.0f} MiB")
    assert after - before < 100, f"the server's peak RSS grew {after - before:.0f} MiB"
