"""ReadBeforeWrite on the real agent loop: writes to existing files need a fresh read in context.

The first test replays DeerFlow #3857 case 2 (a weekly report that got its "US" section five times
because the agent appended without ever reading the file back).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from guard_kit import GuardHarness, Outcome, run_agent
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, RemoveMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.compaction import new_compaction
from agentkeel.harness.context import RunContext
from agentkeel.harness.middleware import read_before_write as rbw
from agentkeel.harness.middleware.chain import build_chain
from agentkeel.harness.middleware.contracts import implemented_axes
from agentkeel.harness.middleware.keys import READ_MARK, TOOL_META, fingerprint
from agentkeel.harness.middleware.read_before_write import (
    ReadBeforeWrite,
    locate,
    newest_mark,
)
from agentkeel.harness.state import agent_state_schema
from agentkeel.runtime.checkpoints import StateAccessor
from agentkeel.sandbox.workspace import Workspace

US = "## US\nNew chips export rules.\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _call(name: str, call_id: str | None = None, **args: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id:
        call["id"] = call_id
    return call


def _turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def _script(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"agents": {"lead": [*turns, {"say": "done"}]}}


def _tools(outcome: Outcome) -> list[ToolMessage]:
    return [m for m in outcome.messages if isinstance(m, ToolMessage)]


def _interventions(outcome: Outcome, action: str | None = None) -> list[dict[str, Any]]:
    records = [r["data"] for r in outcome.journal.kinds("intervention")]
    return [r for r in records if action is None or r["action"] == action]


def _assert_blocked(message: ToolMessage, tool: str, path: str) -> None:
    assert message.status == "error"
    assert message.name == tool
    assert message.content.startswith(f"Error: {tool} blocked: {path} already exists")
    assert "Every write invalidates earlier reads" in message.content
    meta = message.additional_kwargs[TOOL_META]
    assert meta == {
        "status": "error", "error_type": "stale_read", "source": "ReadBeforeWrite",
        "fingerprint": fingerprint(message.content),
    }


# -- (1) the weekly-report replay -------------------------------------------------------------


async def test_weekly_report_replay_appends_the_us_section_once(tmp_path: Path) -> None:
    path = "/workspace/outputs/weekly.md"
    head = "# Weekly\n\nIntro.\n"
    script = _script(
        _turn(_call("write_file", path=path, content=head)),
        _turn(_call("write_file", path=path, content=US, append=True)),
        _turn(_call("read_file", path=path, start_line=2)),  # a ranged read of the tail
        _turn(_call("write_file", path=path, content=US, append=True)),
        _turn(_call("write_file", path=path, content=US, append=True)),  # no re-read
    )
    out = await run_agent(script, [ReadBeforeWrite()], tmp_path / "ws")

    results = _tools(out)
    assert [m.status for m in results] == ["success", "error", "success", "success", "error"]
    _assert_blocked(results[1], "write_file", path)
    _assert_blocked(results[4], "write_file", path)
    assert results[2].content == "\nIntro.\n"
    assert results[2].additional_kwargs[READ_MARK] == {"path": path, "sha256": _sha(head.encode())}
    final = (tmp_path / "ws" / "outputs" / "weekly.md").read_text()
    assert final == head + US
    assert final.count("## US") == 1
    blocked = _interventions(out, "blocked")
    assert [(b["tool"], b["path"], b["reason"]) for b in blocked] == [
        ("write_file", path, "unread"), ("write_file", path, "stale"),
    ]
    assert out.messages[-1].content == "done"
    # The model was shown the block before its next turn.
    assert any(isinstance(m, ToolMessage) and "blocked" in m.content for m in out.requests[2])


# -- (2)/(3) parallel tool calls of one AIMessage ---------------------------------------------


async def test_parallel_appends_on_one_read_exactly_one_lands(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "log.md").write_text("# Log\n")
    script = _script(
        _turn(_call("read_file", path="log.md")),
        _turn(
            _call("write_file", "w-a", path="log.md", content="A\n", append=True),
            _call("write_file", "w-b", path="/workspace/log.md", content="B\n", append=True),
        ),
    )
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    writes = {m.tool_call_id: m for m in _tools(out) if m.name == "write_file"}
    assert sorted(m.status for m in writes.values()) == ["error", "success"]
    loser = next(m for m in writes.values() if m.status == "error")
    _assert_blocked(loser, "write_file", "/workspace/log.md")
    landed = "A\n" if writes["w-a"].status == "success" else "B\n"
    assert (ws / "log.md").read_text() == "# Log\n" + landed
    assert [b["reason"] for b in _interventions(out, "blocked")] == ["stale"]


async def test_read_and_write_in_one_message_blocks_the_write(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "log.md").write_text("# Log\n")
    script = _script(
        _turn(
            _call("read_file", "r", path="log.md"),
            _call("write_file", "w", path="log.md", content=US, append=True),
        ),
    )
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    results = {m.tool_call_id: m for m in _tools(out)}
    assert results["r"].status == "success"
    assert READ_MARK in results["r"].additional_kwargs
    _assert_blocked(results["w"], "write_file", "/workspace/log.md")
    assert (ws / "log.md").read_text() == "# Log\n"


# -- (4) compaction removes the authorisation -------------------------------------------------


@pytest.mark.parametrize("compact", ["removed", "projected", None])
async def test_compacted_read_no_longer_authorises(tmp_path: Path, compact: str | None) -> None:
    """A read that compaction left out of what the model is sent authorises nothing: whether its
    messages were removed from the thread, or (AgentKeel's compaction, a projection) are still in
    the thread but before the cut of the state's ``compaction`` record."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "report.md").write_text("# Report\n")
    script = _script(
        _turn(_call("read_file", path="report.md")),
        {"say": "I have read it."},
        _turn(_call("write_file", path="report.md", content=US, append=True)),
    )
    h = GuardHarness(script, [ReadBeforeWrite()], ws, state_schema=agent_state_schema("full"))
    first = await h.run("read the report")
    read_call, read_result = first.messages[1], first.messages[2]
    assert isinstance(read_call, AIMessage) and isinstance(read_result, ToolMessage)
    if compact == "removed":
        config = {"configurable": {"thread_id": h.thread_id}}
        removed = [RemoveMessage(id=read_call.id), RemoveMessage(id=read_result.id)]
        await h.graph.aupdate_state(config, {"messages": removed})
    elif compact == "projected":
        cut = first.messages.index(read_result) + 1  # the cut passes the read
        record = new_compaction(first.messages, cut, "The report was read.", None, model=None, at="2026-01-01T00:00:00Z")
        await StateAccessor(h.graph, h.saver, mode="full").amutate(h.thread_id, {"compaction": record})
    second = await h.run("now append the US section")

    write = _tools(second)[-1]
    if compact:
        _assert_blocked(write, "write_file", "/workspace/report.md")
        assert (ws / "report.md").read_text() == "# Report\n"
        assert [b["reason"] for b in _interventions(second, "blocked")] == ["unread"]
        assert (read_result.id in {m.id for m in second.messages}) is (compact == "projected")
    else:
        assert write.status == "success"
        assert (ws / "report.md").read_text() == "# Report\n" + US


# -- (5) ranged reads stamp the whole file's hash ---------------------------------------------


async def test_ranged_read_stamps_the_full_file_hash(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    data = b"one\r\ntwo\r\nthree\r\n"
    (ws / "notes.md").write_bytes(data)
    script = _script(
        _turn(_call("read_file", path="notes.md", start_line=2, end_line=2)),
        _turn(_call("write_file", path="notes.md", content="four\r\n", append=True)),
    )
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    read, write = _tools(out)
    assert read.content == "two\r\n"
    assert read.additional_kwargs[READ_MARK] == {"path": "/workspace/notes.md", "sha256": _sha(data)}
    assert read.artifact["sha256"] == _sha(data)
    assert write.status == "success"
    assert (ws / "notes.md").read_bytes() == data + b"four\r\n"


# -- (6) str_replace is gated too -------------------------------------------------------------


async def test_str_replace_needs_a_fresh_mark(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "doc.md").write_text("alpha beta\n")
    script = _script(
        _turn(_call("str_replace", path="doc.md", old="alpha", new="ALPHA")),
        _turn(_call("read_file", path="doc.md")),
        _turn(_call("str_replace", path="doc.md", old="alpha", new="ALPHA")),
        _turn(_call("str_replace", path="doc.md", old="beta", new="BETA")),  # no re-read
    )
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    results = _tools(out)
    assert [m.status for m in results] == ["error", "success", "success", "error"]
    _assert_blocked(results[0], "str_replace", "/workspace/doc.md")
    _assert_blocked(results[3], "str_replace", "/workspace/doc.md")
    assert (ws / "doc.md").read_text() == "ALPHA beta\n"


# -- (7) another writer changed the file after the read ---------------------------------------


async def test_file_changed_on_disk_after_the_read_is_blocked(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "shared.md").write_text("v1\n")
    script = _script(
        _turn(_call("read_file", path="shared.md")),
        {"say": "read"},
        _turn(_call("write_file", path="shared.md", content="mine\n")),
    )
    h = GuardHarness(script, [ReadBeforeWrite()], ws)
    await h.run("read it")
    (ws / "shared.md").write_text("v2 from someone else\n")
    out = await h.run("overwrite it")

    _assert_blocked(_tools(out)[-1], "write_file", "/workspace/shared.md")
    assert (ws / "shared.md").read_text() == "v2 from someone else\n"
    assert [b["reason"] for b in _interventions(out, "blocked")] == ["stale"]


# -- (8) fail-open ----------------------------------------------------------------------------


async def test_uninspectable_file_fails_open_and_is_journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "locked.md").write_text("old\n")

    def refuse(real: Path, deadline: object = None) -> str | None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rbw, "current_sha256", refuse)
    script = _script(_turn(_call("write_file", path="locked.md", content="new\n", append=True)))
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    assert _tools(out)[0].status == "success"
    assert (ws / "locked.md").read_text() == "old\nnew\n"
    assert _interventions(out, "blocked") == []
    (record,) = _interventions(out, "fail_open")
    assert record["path"] == "/workspace/locked.md"
    assert record["tool"] == "write_file"
    assert record["reason"].startswith("PermissionError")


async def test_directory_target_fails_open_and_the_tool_refuses(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "adir").mkdir(parents=True)
    out = await run_agent(_script(_turn(_call("write_file", path="adir", content="x"))), [ReadBeforeWrite()], ws)

    result = _tools(out)[0]
    assert result.status == "error"
    assert "is a directory" in result.content
    (record,) = _interventions(out, "fail_open")
    assert record["reason"].startswith("IsADirectoryError")


async def test_fifo_target_fails_open_instead_of_waiting_and_the_tool_refuses(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "pipe")  # hashing it by reading would wait for a writer forever
    script = _script(_turn(_call("write_file", path="pipe", content="x")))
    out = await asyncio.wait_for(run_agent(script, [ReadBeforeWrite()], ws), 10)

    result = _tools(out)[0]
    assert result.status == "error" and "not a regular file" in result.content
    (record,) = _interventions(out, "fail_open")
    assert "not a regular file" in record["reason"]


# -- (9) path normalisation -------------------------------------------------------------------


async def test_one_key_across_path_spellings(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "a.md").write_text("a\n")
    script = _script(
        _turn(_call("read_file", path="notes/a.md")),
        _turn(_call("write_file", path="/workspace/./notes/../notes/a.md", content="b\n", append=True)),
        _turn(_call("read_file", path="/workspace/notes/a.md")),
        _turn(_call("str_replace", path="notes/./a.md", old="b", new="B")),
    )
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    results = _tools(out)
    assert [m.status for m in results] == ["success"] * 4
    marks = [m.additional_kwargs[READ_MARK]["path"] for m in results if m.name == "read_file"]
    assert marks == ["/workspace/notes/a.md"] * 2
    assert (ws / "notes" / "a.md").read_text() == "a\nB\n"
    assert _interventions(out) == []


async def test_path_outside_the_workspace_passes_to_the_tool(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "outside.md").write_text("keep\n")
    script = _script(_turn(_call("write_file", path="../outside.md", content="x")))
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    result = _tools(out)[0]
    assert result.status == "error"
    assert "access refused" in result.content
    assert TOOL_META not in result.additional_kwargs
    assert (tmp_path / "outside.md").read_text() == "keep\n"
    assert _interventions(out) == []


_SEGMENT = st.sampled_from(["notes", "a.md", "sub", "x-1"])


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(_SEGMENT, min_size=1, max_size=4),
    noise=st.lists(st.sampled_from([".", "", "junk/.."]), max_size=4),
    absolute=st.booleans(),
)
def test_locate_gives_one_key_per_file(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], noise: list[str], absolute: bool
) -> None:
    ws = Workspace(tmp_path_factory.getbasetemp() / "locate")
    canonical = "/workspace/" + "/".join(parts)
    spelled = list(parts)
    for i, extra in enumerate(noise):
        at = min(i, len(spelled) - 1)
        spelled.insert(at, "." if at == 0 and not extra else extra)  # a leading "" would mean "/"
    spelling = ("/workspace/" if absolute else "") + "/".join(spelled)
    located = locate(ws, spelling)
    assert located is not None
    assert located[0] == canonical


def test_locate_refuses_escapes(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    assert locate(ws, "../x") is None
    assert locate(ws, "/etc/passwd") is None
    assert locate(ws, "a\0b") is None


# -- (10) new files ---------------------------------------------------------------------------


async def test_new_files_pass_without_a_read(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    script = _script(
        _turn(_call("write_file", path="fresh/new.md", content="hello\n")),
        _turn(_call("str_replace", path="missing.md", old="a", new="b")),
    )
    out = await run_agent(script, [ReadBeforeWrite()], ws)

    write, replace = _tools(out)
    assert write.status == "success"
    assert (ws / "fresh" / "new.md").read_text() == "hello\n"
    assert replace.status == "error"  # the tool's own error, not the gate's
    assert "no such file" in replace.content
    assert TOOL_META not in replace.additional_kwargs
    assert _interventions(out) == []


# -- helpers and contract ---------------------------------------------------------------------


def _marked(path: str, sha: str, call_id: str) -> ToolMessage:
    return ToolMessage("x", tool_call_id=call_id, additional_kwargs={READ_MARK: {"path": path, "sha256": sha}})


_MARKS = st.tuples(st.sampled_from(["/workspace/a", "/workspace/b"]), st.text(min_size=1, max_size=4))


@given(shas=st.lists(_MARKS, max_size=8))
def test_newest_mark_is_the_last_one_for_the_path(shas: list[tuple[str, str]]) -> None:
    messages = [_marked(path, sha, f"c{i}") for i, (path, sha) in enumerate(shas)]
    for path in ("/workspace/a", "/workspace/b"):
        expected = [sha for p, sha in shas if p == path]
        assert newest_mark(messages, path) == (expected[-1] if expected else None)


def test_contract_matches_hooks_and_builds() -> None:
    mw = ReadBeforeWrite()
    assert implemented_axes(mw) == ["tool"]
    assert set(ReadBeforeWrite.contract.axes) == {"tool"}
    assert ReadBeforeWrite.contract.mandatory_for == frozenset({"subagent"})
    build_chain("lead", [mw])
    build_chain("subagent", [ReadBeforeWrite()])


def _request(ws: Path, call: dict[str, Any]) -> ToolCallRequest:
    ctx = RunContext(thread_id="t-unit", run_id="r", workspace_root=ws)
    return ToolCallRequest(tool_call=call, tool=None, state={"messages": []}, runtime=SimpleNamespace(context=ctx))


async def test_read_result_inside_a_command_is_stamped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "c.md").write_text("c\n")
    call = {"name": "read_file", "args": {"path": "c.md"}, "id": "r1", "type": "tool_call"}
    other = ToolMessage("other", tool_call_id="zz")
    read = ToolMessage("c\n", tool_call_id="r1", artifact={"sha256": "abc", "path": "/workspace/c.md"})

    async def handler(_: ToolCallRequest) -> Command[Any]:
        return Command(update={"messages": [read, other], "extra": 1})

    result = await ReadBeforeWrite().awrap_tool_call(_request(ws, call), handler)
    assert isinstance(result, Command)
    stamped, untouched = result.update["messages"]
    assert stamped.additional_kwargs[READ_MARK] == {"path": "/workspace/c.md", "sha256": "abc"}
    assert READ_MARK not in untouched.additional_kwargs
    assert result.update["extra"] == 1


async def test_reader_without_artifact_is_stamped_with_the_current_hash(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "d.md").write_bytes(b"d\n")
    call = {"name": "read_file", "args": {"path": "d.md"}, "id": "r1", "type": "tool_call"}

    async def handler(_: ToolCallRequest) -> ToolMessage:
        return ToolMessage("d\n", tool_call_id="r1")

    result = await ReadBeforeWrite().awrap_tool_call(_request(ws, call), handler)
    assert result.additional_kwargs[READ_MARK] == {"path": "/workspace/d.md", "sha256": _sha(b"d\n")}


async def test_failed_read_is_not_stamped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "e.md").write_text("e\n")
    call = {"name": "read_file", "args": {"path": "e.md"}, "id": "r1", "type": "tool_call"}

    async def handler(_: ToolCallRequest) -> ToolMessage:
        return ToolMessage("Error: nope", tool_call_id="r1", status="error", artifact={"sha256": "abc"})

    result = await ReadBeforeWrite().awrap_tool_call(_request(ws, call), handler)
    assert READ_MARK not in result.additional_kwargs
