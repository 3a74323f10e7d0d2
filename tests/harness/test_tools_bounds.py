"""The bounds of the workspace tools: off the event loop, linear-time grep, a time limit, bounded
memory, and no waiting on FIFOs. Tools are invoked through a ToolNode, as an agent invokes them."""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import os
import threading
import time
import tracemalloc
from collections.abc import Awaitable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tools import assert_tool_error, call, ok

from agentkeel.harness.context import RunContext
from agentkeel.harness.tools import bounds
from agentkeel.harness.tools.bounds import (
    Deadline,
    TimeLimitExceeded,
    iter_line_pieces,
    off_loop,
)
from agentkeel.sandbox.workspace import Workspace

T = TypeVar("T")
CATASTROPHIC = r"(a+)+$"  # exponential for a backtracking engine on 'aaa…ab'


async def with_loop_gaps(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result and the longest the event loop went without running a 10 ms ticker."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        result = await work
    finally:
        done.set()
        await ticker
    return result, max(gaps, default=0.0)


# --- grep: RE2 ------------------------------------------------------------------------------


async def test_catastrophic_pattern_is_linear_and_leaves_the_loop_free(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "as.txt").write_text(("a" * 40 + "b\n") * 20_000 + "aaaa\n")
    begin = time.monotonic()
    found, gap = await with_loop_gaps(ok(ctx, "grep", pattern=CATASTROPHIC))
    elapsed = time.monotonic() - begin
    assert found == "/workspace/as.txt:20001:aaaa"  # same per-line semantics: $ is the line's end
    assert elapsed < 5, f"grep took {elapsed:.1f} s"
    assert gap < 0.5, f"the event loop stalled {gap:.2f} s"


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)b", r"(?<!a)b", r"(?!x)"])
async def test_patterns_re2_cannot_run_are_errors_naming_them(ctx: RunContext, ws: Workspace, pattern: str) -> None:
    (ws.real_root / "f.txt").write_text("aab\n")
    message = await call(ctx, "grep", pattern=pattern)
    assert_tool_error(message, repr(pattern), "RE2", "backreferences or lookaround")


async def test_grep_marks_cut_lines(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "long.txt").write_text("x" * 2000 + "\nshort x\n")
    lines = (await ok(ctx, "grep", pattern="x")).splitlines()
    assert lines[0] == "/workspace/long.txt:1:" + "x" * 500 + " [... line cut]"
    assert lines[1] == "/workspace/long.txt:2:short x"


# --- the time limit -------------------------------------------------------------------------


async def test_walking_tools_report_the_time_limit(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "f.txt").write_text("hit\n")
    expired = replace(ctx, workspace_tool_timeout_s=1e-9)
    for name, args in (("grep", {"pattern": "hit"}), ("glob", {"pattern": "**"})):
        text = await ok(expired, name, **args)
        assert "stopped" in text and "time limit" in text and "/workspace/f.txt" not in text
    for name, args in (("read_file", {"path": "f.txt"}), ("ls", {})):
        assert_tool_error(await call(expired, name, **args), name, "time limit")
    assert await ok(ctx, "grep", pattern="hit") == "/workspace/f.txt:1:hit"


async def test_off_loop_relays_results_and_errors() -> None:
    assert await off_loop("t", 5, lambda d: threading.current_thread().daemon) is True

    def fail(deadline: Deadline) -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        await off_loop("t", 5, fail)


async def test_cancelling_the_caller_stops_cooperative_work() -> None:
    stopped = threading.Event()
    started = threading.Event()

    def spin(deadline: Deadline) -> None:
        started.set()
        try:
            while True:
                deadline.check()
                time.sleep(0.005)
        finally:
            stopped.set()

    task = asyncio.create_task(off_loop("spin", 60, spin))
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(stopped.wait, 1), "the thread kept running after the cancel"


async def test_work_stuck_in_a_call_is_given_up_without_stalling_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "STUCK_GRACE_S", 0.2)
    release = threading.Event()
    begin = time.monotonic()
    with pytest.raises(TimeLimitExceeded, match="stuck stopped after the 0.1 s time limit"):
        await with_loop_gaps(off_loop("stuck", 0.1, lambda d: release.wait(10)))
    assert time.monotonic() - begin < 2
    release.set()


# --- bounded memory and files that are not regular ------------------------------------------


def write_lines(path: Path, line: bytes, count: int) -> bytes:
    """Write ``count`` copies of ``line`` without holding them all; the file's sha256."""
    digest = hashlib.sha256()
    block = line * 10_000
    with path.open("wb") as handle:
        for _ in range(count // 10_000):
            handle.write(block)
            digest.update(block)
    return digest.digest()


async def test_read_file_streams_huge_files(ctx: RunContext, ws: Workspace) -> None:
    big = ws.real_root / "big.log"
    digest = write_lines(big, b"0123456789" * 3 + b"\n", 1_000_000)  # 31 MB
    tracemalloc.start()
    try:
        message = await call(ctx, "read_file", path="big.log", start_line=999_999, end_line=1_000_001)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.status == "success", message.content
    assert message.content == "0123456789" * 3 + "\n" * 1 + "0123456789" * 3 + "\n"
    assert message.artifact["sha256"] == digest.hex()
    assert peak < 12_000_000, f"read_file held {peak} bytes for a 31 MB file"


async def test_read_file_cuts_one_endless_line_in_bounded_memory(ctx: RunContext, ws: Workspace) -> None:
    one_line = ws.real_root / "one.txt"
    write_lines(one_line, b"y" * 100, 200_000)  # 20 MB, no newline
    tracemalloc.start()
    try:
        text = await ok(ctx, "read_file", path="one.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.startswith("y" * 1000) and "[... cut at 100000 bytes" in text
    assert peak < 12_000_000, f"read_file held {peak} bytes for a 20 MB line"


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_file", {"path": "pipe"}),
        ("write_file", {"path": "pipe", "content": "x"}),
        ("str_replace", {"path": "pipe", "old": "a", "new": "b"}),
        ("grep", {"pattern": "x", "path": "pipe"}),
    ],
)
async def test_fifos_are_refused_not_waited_on(ctx: RunContext, ws: Workspace, tool: str, args: dict[str, Any]) -> None:
    os.mkfifo(ws.real_root / "pipe")
    message = await asyncio.wait_for(call(ctx, tool, **args), 5)
    if tool == "grep":  # grep skips what it cannot read as text
        assert message.content == "No matches for 'x'."
    else:
        assert_tool_error(message, "pipe: not a regular file")


async def test_str_replace_refuses_files_it_would_have_to_load_whole(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "huge.txt").write_bytes(b"a" * (ctx.file_write_max_bytes + 1))
    assert_tool_error(await call(ctx, "str_replace", path="huge.txt", old="a", new="b", replace_all=True), "too large")


async def test_glob_with_many_double_stars_is_not_exponential(ctx: RunContext, ws: Workspace) -> None:
    deep = ws.real_root.joinpath(*[f"d{i}" for i in range(16)])
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("")
    begin = time.monotonic()
    assert await ok(ctx, "glob", pattern="**/" * 20 + "*.txt") == "/workspace/" + "/".join(
        f"d{i}" for i in range(16)) + "/leaf.txt"
    assert "No paths match" in await ok(ctx, "glob", pattern="**/" * 20 + "nothing")
    assert time.monotonic() - begin < 5
    assert_tool_error(await call(ctx, "glob", pattern="a/" * 65), "segments")


# --- streamed lines equal splitlines --------------------------------------------------------

_PIECES = st.lists(
    st.sampled_from([b"a", b"\n", b"\r", b"\r\n", b"\xc3\xa9", b"\xc3", b"\xe2\x80\xa8", b"\x0b", b"\xff", b"xyz"]),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(parts=_PIECES, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_line_pieces_join_to_splitlines(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    bounds_ = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    chunks = iter([data[a:b] for a, b in pairwise(bounds_)])
    lines: list[str] = []
    current = ""
    for piece, ends in iter_line_pieces(chunks):
        current += piece
        if ends:
            lines.append(current)
            current = ""
    if current:
        lines.append(current)
    assert lines == codecs.decode(data, "utf-8", errors="replace").splitlines(keepends=True)
