"""The built-in workspace tools, invoked the way an agent invokes them: through a ToolNode in a
graph compiled with ``context_schema=RunContext``."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from agentkeel.harness.context import RunContext
from agentkeel.harness.tools import WORKSPACE_TOOL_NAMES, build_tools
from agentkeel.harness.tools import search as search_tools
from agentkeel.sandbox.bwrap import BashSandbox, find_bwrap
from agentkeel.sandbox.exec import ProcessGroupRegistry
from agentkeel.sandbox.workspace import Workspace


class Touches:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, str]] = []
        self.hashes: list[str | None] = []

    def touched(
        self, virtual_path: str, tool_call_id: str | None, tool_name: str, after_sha256: str | None = None
    ) -> None:
        self.calls.append((virtual_path, tool_call_id, tool_name))
        self.hashes.append(after_sha256)


class RecordingRegistry(ProcessGroupRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.registered: list[int] = []

    def register(self, pid: int) -> None:
        self.registered.append(pid)
        super().register(pid)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret.txt").write_text("TOPSECRET\n")
    return target


@pytest.fixture
def ws(tmp_path: Path, outside: Path) -> Workspace:
    workspace = Workspace.for_thread(tmp_path / "data", "t1")
    root = workspace.real_root
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("one\ntwo\nthree\nfour\n")
    (root / "notes.txt").write_text("alpha TOPSECRET beta\n")
    (root / "out_dir").symlink_to(outside)
    (root / "out_file").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to(outside / "new.txt")
    (root / "in_link").symlink_to(root / "src")
    return workspace


@pytest.fixture
def touches() -> Touches:
    return Touches()


@pytest.fixture
def ctx(ws: Workspace, touches: Touches) -> RunContext:
    return RunContext(
        thread_id="t1",
        run_id="r1",
        workspace_root=ws.root,
        bash_enabled=True,
        bash_timeout_s=20,
        touches=touches,
        processes=RecordingRegistry(),
    )


def tool_graph(tools: list[BaseTool]) -> Any:
    builder = StateGraph(MessagesState, context_schema=RunContext)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile()


async def call(ctx: RunContext, name: str, call_id: str = "call-1", **args: Any) -> ToolMessage:
    graph = tool_graph(build_tools(bash_enabled=True))
    request = AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])
    state = await graph.ainvoke({"messages": [request]}, context=ctx)
    message = state["messages"][-1]
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == call_id
    return message


async def ok(ctx: RunContext, name: str, **args: Any) -> str:
    """The text of a successful tool call."""
    message = await call(ctx, name, **args)
    assert message.status == "success", message.content
    assert isinstance(message.content, str)
    return message.content


def assert_tool_error(message: ToolMessage, *fragments: str) -> None:
    assert message.status == "error", message.content
    assert isinstance(message.content, str)
    assert "Traceback" not in message.content
    for fragment in fragments:
        assert fragment in message.content


# --- tool selection -------------------------------------------------------------------------


def test_bash_is_absent_unless_enabled() -> None:
    assert "bash" not in [t.name for t in build_tools(bash_enabled=False)]
    assert [t.name for t in build_tools(bash_enabled=True)] == list(WORKSPACE_TOOL_NAMES)
    assert build_tools(bash_enabled=False, names=["bash", "ls"])[0].name == "ls"
    assert [t.name for t in build_tools(True, names=["grep", "bash"])] == ["grep", "bash"]
    with pytest.raises(ValueError, match="nope"):
        build_tools(True, names=["nope"])


async def test_bash_refuses_when_the_run_disables_it(ctx: RunContext) -> None:
    assert_tool_error(
        await call(replace(ctx, bash_enabled=False), "bash", command="true"), "disabled"
    )


# --- read_file ------------------------------------------------------------------------------


async def test_read_file_whole_and_range_carry_hash_of_whole_file(
    ctx: RunContext, ws: Workspace
) -> None:
    digest = hashlib.sha256((ws.real_root / "src" / "main.py").read_bytes()).hexdigest()
    whole = await call(ctx, "read_file", path="/workspace/src/main.py")
    assert whole.status == "success"
    assert whole.content == "one\ntwo\nthree\nfour\n"
    assert whole.artifact == {"sha256": digest, "path": "/workspace/src/main.py"}
    part = await call(ctx, "read_file", path="src/main.py", start_line=2, end_line=3)
    assert part.content == "two\nthree\n"
    assert part.artifact == {"sha256": digest, "path": "/workspace/src/main.py"}
    tail = await call(ctx, "read_file", path="src/main.py", start_line=4, end_line=99)
    assert tail.content == "four\n"
    via_link = await call(ctx, "read_file", path="in_link/main.py", end_line=1)
    assert via_link.content == "one\n"
    assert via_link.artifact["path"] == "/workspace/src/main.py"


async def test_read_file_bad_ranges(ctx: RunContext) -> None:
    assert_tool_error(await call(ctx, "read_file", path="src/main.py", start_line=9), "4 lines")
    assert_tool_error(await call(ctx, "read_file", path="src/main.py", start_line=0), "start_line")
    assert_tool_error(
        await call(ctx, "read_file", path="src/main.py", start_line=3, end_line=2), "before"
    )


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/etc/passwd", "access refused"),
        ("../../../outside/secret.txt", "access refused"),
        ("out_file", "symlink"),
        ("out_dir/secret.txt", "symlink"),
        ("missing.txt", "missing.txt: no such file"),
        ("src", "is a directory"),
    ],
)
async def test_read_file_errors_are_tool_errors(ctx: RunContext, path: str, fragment: str) -> None:
    message = await call(ctx, "read_file", path=path)
    assert_tool_error(message, fragment)
    assert "TOPSECRET" not in message.content
    assert message.artifact is None


async def test_read_file_cuts_huge_selections(ctx: RunContext, ws: Workspace) -> None:
    data = b"0123456789abcdef\n"
    (ws.real_root / "big.txt").write_bytes(data)
    message = await call(replace(ctx, file_read_max_bytes=10), "read_file", path="big.txt")
    assert isinstance(message.content, str)
    assert message.content.startswith("0123456789\n[... cut at 10 bytes (limits.file_read_max_bytes)")
    assert message.artifact["sha256"] == hashlib.sha256(data).hexdigest()


async def test_read_file_refuses_binary(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "blob.bin").write_bytes(b"\x00\x01\x02")
    assert_tool_error(await call(ctx, "read_file", path="blob.bin"), "binary")


# --- write_file and str_replace -------------------------------------------------------------


async def test_write_file_creates_parents_appends_and_reports(
    ctx: RunContext, ws: Workspace, touches: Touches
) -> None:
    first = await call(ctx, "write_file", "c1", path="outputs/deep/r.md", content="héllo\n")
    assert first.status == "success" and "7 bytes" in first.content
    second = await call(
        ctx, "write_file", "c2", path="/workspace/outputs/deep/r.md", content="more\n", append=True
    )
    assert "Appended 5 bytes" in second.content
    assert (ws.real_root / "outputs" / "deep" / "r.md").read_text() == "héllo\nmore\n"
    assert touches.calls == [
        ("/workspace/outputs/deep/r.md", "c1", "write_file"),
        ("/workspace/outputs/deep/r.md", "c2", "write_file"),
    ]
    # Each step reports the whole file's hash after it (the append re-read the file).
    assert touches.hashes == [hashlib.sha256(s.encode()).hexdigest() for s in ("héllo\n", "héllo\nmore\n")]


@pytest.mark.parametrize(
    "path", ["/tmp/evil.txt", "../evil.txt", "out_file", "dangling", "out_dir/x"]
)
async def test_write_file_never_writes_outside(
    ctx: RunContext, outside: Path, touches: Touches, path: str
) -> None:
    assert_tool_error(await call(ctx, "write_file", path=path, content="pwned"), "access refused")
    assert (outside / "secret.txt").read_text() == "TOPSECRET\n"
    assert not (outside / "new.txt").exists() and not (outside / "x").exists()
    assert touches.calls == []


async def test_str_replace_counts_and_replace_all(
    ctx: RunContext, ws: Workspace, touches: Touches
) -> None:
    target = ws.real_root / "dup.txt"
    target.write_bytes(b"x = 1\r\nx = 1\r\ny = 2\r\n")
    assert_tool_error(await call(ctx, "str_replace", path="dup.txt", old="z", new="w"), "not found")
    assert_tool_error(
        await call(ctx, "str_replace", path="dup.txt", old="x = 1", new="x = 3"), "occurs 2 times"
    )
    assert touches.calls == []
    one = await call(ctx, "str_replace", "c1", path="dup.txt", old="y = 2", new="y = 5")
    assert one.status == "success" and "1 occurrence" in one.content
    every = await call(
        ctx, "str_replace", "c2", path="dup.txt", old="x = 1", new="x = 3", replace_all=True
    )
    assert "2 occurrences" in every.content
    assert target.read_bytes() == b"x = 3\r\nx = 3\r\ny = 5\r\n"
    assert touches.calls == [
        ("/workspace/dup.txt", "c1", "str_replace"),
        ("/workspace/dup.txt", "c2", "str_replace"),
    ]
    assert_tool_error(
        await call(ctx, "str_replace", path="out_file", old="TOP", new="x"), "symlink"
    )


# --- ls, glob, grep -------------------------------------------------------------------------


async def test_ls(ctx: RunContext) -> None:
    listing = await ok(ctx, "ls")
    assert listing.splitlines() == [
        "dangling@",
        "in_link@",
        "notes.txt  (21 bytes)",
        "out_dir@",
        "out_file@",
        "outputs/",
        "src/",
        "uploads/",
    ]
    assert await ok(ctx, "ls", path="/workspace/outputs") == "/workspace/outputs is empty"
    assert_tool_error(await call(ctx, "ls", path="notes.txt"), "not a directory")
    assert_tool_error(await call(ctx, "ls", path="out_dir"), "access refused")
    assert_tool_error(await call(ctx, "ls", path="/etc"), "access refused")


async def test_glob_is_confined_sorted_and_capped(
    ctx: RunContext, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws.real_root / "src" / "pkg").mkdir()
    (ws.real_root / "src" / "pkg" / "b.py").write_text("")
    found = await ok(ctx, "glob", pattern="**/*.py")
    assert found.splitlines() == ["/workspace/src/main.py", "/workspace/src/pkg/b.py"]
    assert (await ok(ctx, "glob", pattern="/workspace/src/*")).splitlines() == [
        "/workspace/src/main.py",
        "/workspace/src/pkg",
    ]
    everything = await ok(ctx, "glob", pattern="**")
    assert "secret" not in everything and "/workspace/out_dir" not in everything
    assert "/workspace/in_link" in everything
    assert "No paths match" in await ok(ctx, "glob", pattern="*.rs")
    assert_tool_error(await call(ctx, "glob", pattern="/etc/*"), "relative")
    assert_tool_error(await call(ctx, "glob", pattern="../**"), "..")
    monkeypatch.setattr(search_tools, "GLOB_CAP", 3)
    for i in range(5):
        (ws.real_root / "outputs" / f"f{i}.md").write_text("")
    capped = (await ok(ctx, "glob", pattern="outputs/*.md")).splitlines()
    assert capped == [
        "/workspace/outputs/f0.md",
        "/workspace/outputs/f1.md",
        "/workspace/outputs/f2.md",
        "[... 2 more matches; narrow the pattern]",
    ]


async def test_grep_is_confined_skips_binary_and_caps(ctx: RunContext, ws: Workspace) -> None:
    (ws.real_root / "blob.bin").write_bytes(b"TOPSECRET\x00")
    found = await ok(ctx, "grep", pattern=r"TOP\w+")
    assert found == "/workspace/notes.txt:1:alpha TOPSECRET beta"
    assert (await ok(ctx, "grep", pattern="^t", path="src/main.py")).splitlines() == [
        "/workspace/src/main.py:2:two",
        "/workspace/src/main.py:3:three",
    ]
    assert "No matches" in await ok(ctx, "grep", pattern="zzz")
    assert_tool_error(
        await call(ctx, "grep", pattern="(", path="src"), "invalid regular expression"
    )
    assert_tool_error(await call(ctx, "grep", pattern="x", path="out_dir"), "access refused")
    assert_tool_error(await call(ctx, "grep", pattern="x", path="/etc/passwd"), "access refused")
    (ws.real_root / "many.txt").write_text("hit\n" * (search_tools.GREP_CAP + 50))
    lines = (await ok(ctx, "grep", pattern="hit", path="many.txt")).splitlines()
    assert len(lines) == search_tools.GREP_CAP + 1
    assert lines[-1].startswith("[... stopped after")


async def test_invalid_arguments_are_tool_errors(ctx: RunContext) -> None:
    assert_tool_error(await call(ctx, "read_file", start_line=1))


# --- bash -----------------------------------------------------------------------------------


def live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes whose process group is ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


async def wait_group_gone(pgid: int, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (members := live_group_members(pgid)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return members


async def test_bash_runs_in_workspace_and_reports_changes(
    ctx: RunContext, ws: Workspace, touches: Touches
) -> None:
    command = "pwd; echo new > outputs/a.txt; echo more >> notes.txt; rm src/main.py; exit 2"
    message = await call(ctx, "bash", "b1", command=command)
    assert message.status == "success"
    assert message.content == f"{ws.real_root}\n[exit code 2]"
    assert touches.calls == [
        ("/workspace/notes.txt", "b1", "bash"),
        ("/workspace/outputs/a.txt", "b1", "bash"),
        ("/workspace/src/main.py", "b1", "bash"),
    ]
    assert isinstance(ctx.processes, RecordingRegistry) and len(ctx.processes.registered) == 1
    assert ctx.processes.kill_all() == 0


async def test_bash_runs_in_the_runs_sandbox(
    ctx: RunContext, ws: Workspace, touches: Touches, outside: Path, request: pytest.FixtureRequest
) -> None:
    if find_bwrap() is None:
        root = request.config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
        root.service_unavailable("bubblewrap", "bwrap is not installed (apt-get install -y bubblewrap)")
    sandboxed = replace(ctx, bash_sandbox=BashSandbox(hidden=(outside,)))
    command = f"pwd; echo new > outputs/a.txt; cat {outside}/secret.txt; touch {outside}/x; exit 3"
    message = await call(sandboxed, "bash", "b1", command=command)
    assert isinstance(message.content, str) and message.content.startswith(f"{ws.real_root}\n")
    assert "TOPSECRET" not in message.content and message.content.endswith("[exit code 3]")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert touches.calls == [("/workspace/outputs/a.txt", "b1", "bash")]


async def test_bash_timeout_is_capped_by_context_and_kills_group(ctx: RunContext) -> None:
    tight = replace(ctx, bash_timeout_s=0.5)
    started = time.monotonic()
    message = await call(tight, "bash", command="sleep 30 & sleep 30; wait", timeout_s=100)
    assert time.monotonic() - started < 10
    assert_tool_error(message, "timed out after 0.5s")
    assert isinstance(tight.processes, RecordingRegistry)
    assert await wait_group_gone(tight.processes.registered[0]) == []


async def test_bash_output_cap(ctx: RunContext) -> None:
    output = await ok(replace(ctx, bash_output_cap=100), "bash", command="seq 1 50000")
    assert "bytes of output omitted" in output
    assert output.startswith("1\n2\n") and output.endswith("50000\n[exit code 0]")
    assert len(output) < 250


async def test_cancelling_the_run_kills_slow_bash(ctx: RunContext, touches: Touches) -> None:
    graph = tool_graph(build_tools(bash_enabled=True))
    command = "echo started > outputs/flag; sleep 30 & sleep 30; wait"
    request = AIMessage(
        content="", tool_calls=[{"name": "bash", "args": {"command": command}, "id": "slow"}]
    )
    task = asyncio.create_task(graph.ainvoke({"messages": [request]}, context=ctx))
    assert isinstance(ctx.processes, RecordingRegistry)
    deadline = time.monotonic() + 5
    while not (ctx.processes.registered and live_group_members(ctx.processes.registered[0])):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    pgid = ctx.processes.registered[0]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_group_gone(pgid) == []
    assert ("/workspace/outputs/flag", "slow", "bash") in touches.calls
    assert ctx.processes.kill_all() == 0


async def test_worker_kill_all_stops_slow_bash(ctx: RunContext) -> None:
    task = asyncio.create_task(call(ctx, "bash", command="sleep 30 & sleep 30; wait"))
    assert isinstance(ctx.processes, RecordingRegistry)
    deadline = time.monotonic() + 5
    while not ctx.processes.registered:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    pgid = ctx.processes.registered[0]
    assert ctx.processes.kill_all() == 1
    message = await asyncio.wait_for(task, 10)
    assert "killed by signal 9" in message.content
    assert await wait_group_gone(pgid) == []
