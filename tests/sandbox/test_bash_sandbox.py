"""The bash sandbox, tried as an attacker would: real bubblewrap, real processes.

Every "cannot" here is set up so that only the sandbox stops it: the targets are world-readable
and world-writable on the host, the secret is in this very process's environment.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkeel import config as config_module
from agentkeel.config import ConfigError, load_config
from agentkeel.sandbox.bwrap import BashSandbox, find_bwrap
from agentkeel.sandbox.exec import CommandResult, run_command

SECRET = "keel-test-secret-4f1c9a"
HOST_TMP = "/var/tmp"
"""Where the targets live: a host directory, unlike /tmp which the sandbox replaces with its own."""


@pytest.fixture
def bwrap_present(request: pytest.FixtureRequest) -> None:
    if find_bwrap() is None:
        root = request.config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
        root.service_unavailable("bubblewrap", "bwrap is not installed (apt-get install -y bubblewrap)")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory whose every level is world-readable (pytest's tmp dirs are 0700), so that
    only the sandbox stands between a command and another thread's files."""
    path = Path(tempfile.mkdtemp(prefix="keel-sandbox-", dir=HOST_TMP))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _open_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    for part in (path, *path.parents):
        if part.name.startswith("keel-sandbox-"):
            break
        part.chmod(0o777)
    return path


@pytest.fixture
def workspace(bwrap_present: None, data_dir: Path) -> Path:
    return _open_dir(data_dir / "threads" / "mine" / "workspace")


@pytest.fixture
def other_workspace(data_dir: Path) -> Path:
    other = _open_dir(data_dir / "threads" / "theirs" / "workspace")
    victim = other / "notes.txt"
    victim.write_text("theirs\n")
    victim.chmod(0o666)
    return other


@pytest.fixture
def outside(data_dir: Path) -> Iterator[Path]:
    """A world-writable host file outside the data directory."""
    folder = Path(tempfile.mkdtemp(prefix="keel-outside-", dir=HOST_TMP))
    folder.chmod(0o777)
    target = folder / "host.txt"
    target.write_text("host\n")
    target.chmod(0o666)
    yield target
    shutil.rmtree(folder, ignore_errors=True)


def sandbox(data_dir: Path, **overrides: object) -> BashSandbox:
    return BashSandbox(**{"hidden": (data_dir,), **overrides})  # type: ignore[arg-type]


async def sh(command: str, workspace: Path, box: BashSandbox, timeout_s: float = 20) -> CommandResult:
    return await run_command(command, workspace, timeout_s, 64_000, sandbox=box)


def processes_with(marker: str, exact_start: bool = False) -> list[int]:
    """Host pids whose command line contains ``marker`` (or starts with it), bwrap's own excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found_it = cmdline.startswith(marker) if exact_start else marker in cmdline
            if found_it and not cmdline.startswith("bwrap "):
                found.append(int(entry.name))
    return found


async def test_no_secret_of_the_server_is_readable(workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_TEST_SECRET", SECRET)
    command = (
        "env; cat /proc/1/environ; cat /proc/$PPID/environ; cat /proc/*/environ; "
        "grep -rs keel-test /proc/*/environ /proc/*/cmdline; echo done"
    )
    result = await sh(command, workspace, sandbox(data_dir))
    assert "done" in result.output
    assert SECRET not in result.output
    assert "KEEL_TEST_SECRET" not in result.output
    env_lines = set(result.output.splitlines())
    assert f"HOME={workspace}" in env_lines and "LANG=C.UTF-8" in env_lines


async def test_workspace_is_the_only_writable_path(workspace: Path, other_workspace: Path, outside: Path, data_dir: Path) -> None:
    before = {p: p.read_bytes() for p in (outside, other_workspace / "notes.txt")}
    command = (
        f"pwd; echo mine > mine.txt; echo x > {outside}; echo x > {other_workspace}/notes.txt; "
        f"touch {outside.parent}/new {data_dir}/new /etc/new /usr/new /tmp/scratch; "
        f"rm -f {outside}; ls {other_workspace}; ls {data_dir}/threads; echo end"
    )
    result = await sh(command, workspace, sandbox(data_dir))
    assert result.output.splitlines()[0] == str(workspace)  # reported at its host path
    assert (workspace / "mine.txt").read_text() == "mine\n"
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in outside.parent.iterdir()) == ["host.txt"]
    assert sorted(p.name for p in data_dir.iterdir()) == ["threads"]
    assert not Path("/etc/new").exists() and not Path("/usr/new").exists()
    lines = result.output.splitlines()
    assert "notes.txt" not in lines and "mine" not in lines and "theirs" not in lines  # nothing listed
    assert "end" in result.output


async def test_fork_bomb_is_contained_and_the_loop_stays_responsive(workspace: Path, data_dir: Path) -> None:
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    try:
        result = await sh(
            "bomb-marker-731() { bomb-marker-731 | bomb-marker-731 & }; bomb-marker-731; sleep 30",
            workspace,
            sandbox(data_dir, max_processes=40),
            timeout_s=4,
        )
    finally:
        task.cancel()
    elapsed = time.monotonic() - started
    assert elapsed < 4 + 2 + 2  # timeout + TERM grace + drain
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 20 and max(gaps) < 1.0, f"event loop stalled: max gap {max(gaps):.2f}s"
    assert processes_with("bomb-marker-731") == []
    assert result.timed_out


async def test_memory_hog_is_refused(workspace: Path, data_dir: Path) -> None:
    started = time.monotonic()
    result = await sh(
        "python3 -c 'b = bytearray(1 << 30); print(\"allocated\")'",
        workspace,
        sandbox(data_dir, memory_mb=256),
    )
    assert time.monotonic() - started < 10
    assert "allocated" not in result.output and "MemoryError" in result.output
    assert result.exit_code != 0


async def test_file_size_limit(workspace: Path, data_dir: Path) -> None:
    result = await sh("head -c 3000000 /dev/zero > big.bin; echo status=$?", workspace, sandbox(data_dir, max_file_mb=1))
    assert (workspace / "big.bin").stat().st_size <= 1024 * 1024
    assert "status=0" not in result.output


async def test_background_processes_are_gone_after_the_call(workspace: Path, data_dir: Path) -> None:
    result = await sh("sleep 987654 & setsid sleep 987655 & echo started", workspace, sandbox(data_dir))
    assert "started" in result.output
    deadline = time.monotonic() + 5
    while processes_with("sleep 98765") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert processes_with("sleep 98765") == []


async def test_network_is_unreachable_by_default(workspace: Path, data_dir: Path) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo connected || echo refused"
    try:
        closed = await sh(probe, workspace, sandbox(data_dir))
        opened = await sh(probe, workspace, sandbox(data_dir, network=True))
    finally:
        server.close()
    assert closed.output.strip() == "refused"
    assert opened.output.strip() == "connected"  # the probe itself works when allowed


def test_bash_without_bubblewrap_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(config_module, "find_bwrap", lambda: None)
    file = tmp_path / "keel.yaml"
    file.write_text("tools:\n  bash: true\n")
    with pytest.raises(ConfigError, match=r"tools\.bash: .*install it \(Debian package bubblewrap\)"):
        load_config(file, env={})
    file.write_text("tools:\n  bash: true\n  bash_unsandboxed: true\n")
    with caplog.at_level(logging.WARNING, logger="agentkeel.config"):
        config = load_config(file, env={})
    assert config.bash_sandbox() is None
    assert any("without a sandbox" in r.getMessage() for r in caplog.records)
    file.write_text("tools:\n  bash: false\n")
    assert load_config(file, env={}).bash_sandbox() is not None  # off: nothing to refuse


def test_sandbox_hides_the_data_dir_and_configured_paths(tmp_path: Path) -> None:
    file = tmp_path / "keel.yaml"
    file.write_text("data_dir: data\ntools:\n  bash_hide: [secrets]\n  bash_max_processes: 7\n")
    box = load_config(file, env={}).bash_sandbox()
    assert box is not None
    assert box.hidden == (tmp_path / "data", file, tmp_path / "secrets") and box.max_processes == 7


async def test_hidden_files_read_empty(workspace: Path, data_dir: Path, outside: Path) -> None:
    result = await sh(f"cat {outside}; echo x >> {outside}; echo end", workspace, sandbox(data_dir, hidden=(data_dir, outside)))
    assert "host" not in result.output.splitlines() and result.output.endswith("end\n")
    assert outside.read_text() == "host\n"


def sleepers() -> list[int]:
    return processes_with("sleep 98765", exact_start=True)


async def test_cancelling_the_call_kills_the_sandbox(workspace: Path, data_dir: Path) -> None:
    task = asyncio.create_task(sh("setsid sleep 987656 & sleep 987657; true", workspace, sandbox(data_dir)))
    deadline = time.monotonic() + 5
    while len(sleepers()) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(sleepers()) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 5
    while processes_with("sleep 98765") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert processes_with("sleep 98765") == []


async def test_limits_cannot_be_raised_and_no_privilege_is_left(workspace: Path, data_dir: Path) -> None:
    command = (
        "ulimit -u 100000 && echo raised; ulimit -v unlimited && echo raised; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"
    )
    result = await sh(command, workspace, sandbox(data_dir))
    assert "raised" not in result.output
    assert "CapEff:\t0000000000000000" in result.output and "NoNewPrivs:\t1" in result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the workspace is handed to another uid only when the server is root")
def test_handing_the_workspace_over_never_reaches_outside(workspace: Path, outside: Path) -> None:
    (workspace / "sub").mkdir()
    (workspace / "sub" / "own.txt").write_text("x")
    (workspace / "link").symlink_to(outside)
    (workspace / "sub" / "dirlink").symlink_to(outside.parent)
    os.link(outside, workspace / "hard")
    BashSandbox(root_uid=4242).prepare(workspace)
    assert (workspace / "sub" / "own.txt").stat().st_uid == 4242 and workspace.stat().st_uid == 4242
    assert outside.stat().st_uid == 0 and outside.parent.stat().st_uid == 0
    assert (workspace / "link").lstat().st_uid == 4242  # the link itself, not its target
