"""Shell command execution: bounded time and output, process groups killed, no env leak."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from agentkeel.sandbox import exec as exec_module
from agentkeel.sandbox.exec import ProcessGroupRegistry, run_command

SPAWN_AND_SLEEP = "sleep 30 & echo $! > bg.pid; echo $$ > sh.pid; sleep 30; wait"


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (zombies awaiting a reaper count as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # it exited between the open and the read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_dead(pids: list[int], within_s: float = 5.0) -> list[int]:
    """The pids still alive after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return []
        await asyncio.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


async def read_pids(cwd: Path, names: tuple[str, ...] = ("bg.pid", "sh.pid")) -> list[int]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        files = [cwd / name for name in names]
        if all(f.exists() and f.read_text().strip() for f in files):
            return [int(f.read_text()) for f in files]
        await asyncio.sleep(0.02)
    raise AssertionError("command did not write its pids")


async def test_output_and_exit_code(tmp_path: Path) -> None:
    result = await run_command("echo out; echo err >&2; exit 3", tmp_path, 10, 1000)
    assert result.exit_code == 3
    assert result.output == "out\nerr\n"
    assert not result.timed_out and not result.truncated


async def test_cwd_and_minimal_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPER_SECRET_TOKEN", "hunter2")
    result = await run_command("pwd; env", tmp_path, 10, 10_000)
    lines = result.output.splitlines()
    assert lines[0] == str(tmp_path)
    assert "hunter2" not in result.output
    assert f"HOME={tmp_path}" in lines
    assert any(line.startswith("PATH=") for line in lines)


async def test_output_cap_keeps_head_and_tail(tmp_path: Path) -> None:
    result = await run_command("echo START; seq 1 100000; echo END", tmp_path, 10, 200)
    assert result.truncated
    assert result.output.startswith("START\n")
    assert result.output.rstrip().endswith("END")
    assert "bytes of output omitted" in result.output
    assert len(result.output) < 300


async def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await run_command(SPAWN_AND_SLEEP, tmp_path, 0.5, 1000)
    assert time.monotonic() - started < 10
    assert result.timed_out
    assert result.exit_code < 0
    assert await wait_dead(await read_pids(tmp_path)) == []


async def test_background_jobs_do_not_outlive_the_command(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await run_command("sleep 30 & echo $! > bg.pid; echo started", tmp_path, 10, 1000)
    assert time.monotonic() - started < 5, "a background job holding stdout must not delay the end"
    assert result.exit_code == 0 and result.output == "started\n" and not result.timed_out
    assert await wait_dead(await read_pids(tmp_path, ("bg.pid",))) == []


async def test_sigterm_ignoring_commands_get_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exec_module, "TERM_GRACE_S", 0.3)
    command = "trap '' TERM; echo $$ > sh.pid; sleep 30 & echo $! > bg.pid; wait"
    result = await run_command(command, tmp_path, 0.3, 1000)
    assert result.timed_out
    assert await wait_dead(await read_pids(tmp_path)) == []


async def test_cancellation_kills_the_process_group(tmp_path: Path) -> None:
    seen: list[int] = []
    task = asyncio.create_task(
        run_command(SPAWN_AND_SLEEP, tmp_path, 60, 1000, on_start=seen.append, on_exit=seen.append)
    )
    pids = await read_pids(tmp_path)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(pids) == []
    assert len(seen) == 2 and seen[0] == seen[1] == pids[1]


async def test_registry_tracks_and_kills_live_commands(tmp_path: Path) -> None:
    registry = ProcessGroupRegistry()
    task = asyncio.create_task(
        run_command(
            SPAWN_AND_SLEEP,
            tmp_path,
            60,
            1000,
            on_start=registry.register,
            on_exit=registry.unregister,
        )
    )
    pids = await read_pids(tmp_path)
    assert registry.kill_all() == 1
    result = await asyncio.wait_for(task, 10)
    assert result.exit_code < 0 and not result.timed_out
    assert await wait_dead(pids) == []
    assert registry.kill_all() == 0


async def test_registry_kill_all_on_foreign_process_groups(tmp_path: Path) -> None:
    registry = ProcessGroupRegistry()
    proc = subprocess.Popen(["bash", "-c", SPAWN_AND_SLEEP], cwd=tmp_path, start_new_session=True)
    try:
        registry.register(proc.pid)
        pids = await read_pids(tmp_path)
        assert registry.kill_all() == 1
        proc.wait(timeout=5)
        assert await wait_dead(pids) == []
    finally:
        proc.kill()
        proc.wait()
    registry.register(proc.pid)
    registry.unregister(proc.pid)
    assert registry.kill_all() == 0
