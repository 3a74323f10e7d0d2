"""The file tools' byte caps and what they refuse to open: hard links, devices, FIFOs, sockets, and
paths swapped for symlinks after they were checked. Every refusal is a tool error with nothing
changed, inside the workspace or out."""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import stat
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_tools import assert_tool_error, call, ok

from agentkeel.harness.context import RunContext
from agentkeel.harness.tools.bounds import open_regular
from agentkeel.sandbox.workspace import Workspace

GIB = 1 << 30


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_text("host file\n")
    return target


# --- byte caps ------------------------------------------------------------------------------


async def test_read_file_of_a_1_gib_file_stays_in_bounded_memory(ctx: RunContext, ws: Workspace) -> None:
    huge = ws.real_root / "huge.log"
    with huge.open("wb") as handle:
        handle.write(b"first line\n" + b"x" * 20_000 + b"\n")
        handle.truncate(GIB)  # sparse: the rest reads as NUL bytes, one endless line
    before_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        message = await call(ctx, "read_file", path="huge.log")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_rss_kib) / 1024
    assert isinstance(message.content, str)
    assert message.content.startswith("first line\n")
    assert "[... cut at 100000 bytes (limits.file_read_max_bytes)" in message.content
    assert len(message.content.encode()) < 100_000 + 200
    assert peak < 16_000_000, f"read_file held {peak} bytes of a 1 GiB file"
    assert growth_mib < 64, f"read_file grew the process by {growth_mib:.0f} MiB"
    # the whole file was still hashed (the read-before-write guard compares it later)
    assert isinstance(message.artifact["sha256"], str) and len(message.artifact["sha256"]) == 64


async def test_read_file_cut_keeps_whole_characters(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "u.txt").write_text("é" * 10)  # 2 bytes each
    text = await ok(replace(ctx, file_read_max_bytes=5), "read_file", path="u.txt")
    assert text.startswith("éé\n[... cut at 5 bytes")


async def test_write_file_refuses_content_over_the_cap(ctx: RunContext, ws: Workspace) -> None:
    small = replace(ctx, file_write_max_bytes=10)
    message = await call(small, "write_file", path="a.txt", content="x" * 11)
    assert_tool_error(message, "11 bytes", "10-byte limits.file_write_max_bytes", "nothing was written")
    assert not (ws.real_root / "a.txt").exists()
    assert "Wrote 10 bytes" in await ok(small, "write_file", path="a.txt", content="x" * 10)


async def test_append_may_not_grow_a_file_past_the_cap(ctx: RunContext, ws: Workspace) -> None:
    small = replace(ctx, file_write_max_bytes=10)
    (ws.real_root / "log.txt").write_text("12345678")
    message = await call(small, "write_file", path="log.txt", content="abc", append=True)
    assert_tool_error(message, "would be 11 bytes", "limits.file_write_max_bytes")
    assert (ws.real_root / "log.txt").read_text() == "12345678"


async def test_str_replace_refuses_a_result_over_the_cap(ctx: RunContext, ws: Workspace) -> None:
    small = replace(ctx, file_write_max_bytes=10)
    (ws.real_root / "f.txt").write_text("aaaa")
    message = await call(small, "str_replace", path="f.txt", old="a", new="bbb", replace_all=True)
    assert_tool_error(message, "would be 12 bytes", "limits.file_write_max_bytes")
    assert (ws.real_root / "f.txt").read_text() == "aaaa"
    (ws.real_root / "g.txt").write_text("a" * 11)
    message = await call(small, "str_replace", path="g.txt", old="a", new="b", replace_all=True)
    assert_tool_error(message, "too large for str_replace", "10-byte limits.file_write_max_bytes")


# --- what is refused ------------------------------------------------------------------------

CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("write_file", {"content": "owned\n"}),
    ("write_file", {"content": "owned\n", "append": True}),
    ("str_replace", {"old": "host", "new": "owned"}),
]


@pytest.mark.parametrize(("tool", "args"), CHANGES)
async def test_a_hard_link_to_a_host_file_is_never_written(
    ctx: RunContext, ws: Workspace, outside: Path, tool: str, args: dict[str, Any]
) -> None:
    os.link(outside, ws.real_root / "planted.txt")
    message = await call(ctx, tool, path="planted.txt", **args)
    assert_tool_error(message, "planted.txt", "2 hard links")
    assert outside.read_text() == "host file\n"


async def test_a_hard_link_is_not_read_either(ctx: RunContext, ws: Workspace, outside: Path) -> None:
    os.link(outside, ws.real_root / "planted.txt")
    message = await call(ctx, "read_file", path="planted.txt")
    assert_tool_error(message, "hard links")
    assert "host file" not in message.content


def _make_socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()


def _make_device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # like /dev/null


@pytest.mark.parametrize("make", [_make_socket, _make_device, os.mkfifo])
@pytest.mark.parametrize(("tool", "args"), [*CHANGES, ("read_file", {})])
async def test_special_files_are_refused(
    ctx: RunContext, ws: Workspace, make: Any, tool: str, args: dict[str, Any]
) -> None:
    make(ws.real_root / "special")
    assert_tool_error(await call(ctx, tool, path="special", **args), "special")
    assert not stat.S_ISREG(os.lstat(ws.real_root / "special").st_mode)


# --- a swap between the path check and the open ---------------------------------------------


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    ws: Workspace, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws.real_root / "dir").mkdir()
    real = ws.resolve("dir/new.txt")  # checked while dir/ is a directory
    (ws.real_root / "dir").rmdir()
    (ws.real_root / "dir").symlink_to(elsewhere)  # then swapped
    with pytest.raises(OSError):
        open_regular(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, beneath=ws.real_root, make_parents=True)
    assert list(elsewhere.iterdir()) == []


def test_a_file_swapped_for_a_symlink_or_hard_link_after_the_check_is_not_changed(
    ws: Workspace, outside: Path
) -> None:
    target = ws.real_root / "f.txt"
    target.write_text("mine\n")
    real = ws.resolve("f.txt")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(OSError, match="symlink"):
        open_regular(real, flags, beneath=ws.real_root)
    target.unlink()
    os.link(outside, target)
    with pytest.raises(OSError, match="hard links"):
        open_regular(real, flags, beneath=ws.real_root)
    assert hashlib.sha256(outside.read_bytes()).hexdigest() == hashlib.sha256(b"host file\n").hexdigest()
