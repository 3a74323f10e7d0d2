"""ToolErrorHandling and the tool-result classification it stamps (``TOOL_META``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
from guard_kit import GuardHarness, run_agent
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, ToolException, tool
from langgraph.types import Command, interrupt

from agentkeel.harness.middleware.keys import TOOL_META, fingerprint
from agentkeel.harness.middleware.tool_error_handling import (
    DETAIL_MAX_CHARS,
    ToolErrorHandling,
    stamp_result,
)
from agentkeel.harness.middleware.tool_meta import STATUSES, classify

# -- classification (pure) ---------------------------------------------------------------------

CASES: list[tuple[str, str | None, str]] = [
    # (content, ToolMessage.status or None for "success", expected status)
    ("Found 3 files: a.py b.py c.py", None, "ok"),
    ("", None, "empty"),
    ("   \n\t ", None, "empty"),
    ("No results found.", None, "empty"),
    ("No matches for 'foo'.", None, "empty"),
    ("Search returned 0 matches", None, "empty"),
    ("I have not found any relevant pages", None, "empty"),
    ("No paths match '*.rs'.", None, "empty"),
    ("A long report. " * 40 + "There were no results in 2019.", None, "ok"),
    ("Error: something broke", None, "error"),
    ("  Error: leading spaces", None, "error"),
    ("disk full", "error", "error"),
    ("Error: HTTP 401 Unauthorized", None, "auth"),
    ("403 forbidden by upstream", "error", "auth"),
    ("the provider says: unauthorized", "error", "auth"),
    ("Error: Invalid API key supplied", None, "auth"),
    ("Error: invalid_api_key", None, "auth"),
    ("Error: rate limit exceeded", None, "rate_limited"),
    ("status 429", "error", "rate_limited"),
    ("Too Many Requests, slow down", "error", "rate_limited"),
    ("Error: ratelimited by the search backend", None, "rate_limited"),
    ("Error: web search is not configured", None, "config"),
    ("ripgrep not installed", "error", "config"),
    ("Error: missing API key for tavily", None, "config"),
    ("Error: this tool is disabled", None, "config"),
    # Numeric codes count on word boundaries only.
    ("Error: request id 14012 failed", None, "error"),
    ("Error: port 4290 closed", None, "error"),
    ("Error: see /v1/items/4030", None, "error"),
    # A success that merely mentions a keyword is still a success.
    ("The 401(k) plan documentation, chapter three, describes contributions in detail.", None, "ok"),
    ("Error: no results for that query", None, "error"),
]


@pytest.mark.parametrize(("content", "status", "expected"), CASES)
def test_classify_table(content: str, status: str | None, expected: str) -> None:
    message = ToolMessage(content=content, tool_call_id="c1", status=status or "success")
    meta = classify(message, "tool")
    assert meta == {"status": expected, "fingerprint": fingerprint(content), "source": "tool"}


def test_classify_list_content_and_error_type() -> None:
    message = ToolMessage(content=[{"type": "text", "text": "Error: 429 slow down"}], tool_call_id="c1")
    meta = classify(message, "exception", error_type="HTTPError")
    assert meta["status"] == "rate_limited"
    assert meta["error_type"] == "HTTPError"
    assert meta["fingerprint"] == fingerprint("Error: 429 slow down")


@given(st.text(max_size=400), st.sampled_from(["success", "error"]))
def test_classify_is_total_and_error_status_is_never_ok(text: str, status: str) -> None:
    meta = classify(ToolMessage(content=text, tool_call_id="c", status=status), "tool")
    assert meta["status"] in STATUSES
    assert meta["fingerprint"] == fingerprint(text)
    if status == "error":
        assert meta["status"] not in ("ok", "empty")


# -- the middleware in the real agent ----------------------------------------------------------


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"agents": {"lead": [{"tool_calls": list(calls)}, {"say": "done"}]}}


def _tool_messages(messages: list[Any]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


async def test_exception_becomes_error_result_with_meta(tmp_path: Path) -> None:
    @tool
    def explode(q: str) -> str:
        """Always fails."""
        raise RuntimeError("backend said 401 Unauthorized")

    out = await run_agent(_calls({"name": "explode", "args": {"q": "x"}, "id": "c-1"}), [ToolErrorHandling()],
                          tmp_path / "ws", tools=[explode])
    (result,) = _tool_messages(out.messages)
    assert result.status == "error"
    assert result.name == "explode" and result.tool_call_id == "c-1"
    assert result.content == (
        "Error: tool explode failed with RuntimeError: backend said 401 Unauthorized. "
        "Continue with the context you have, or choose another tool."
    )
    meta = result.additional_kwargs[TOOL_META]
    assert meta == {"status": "auth", "fingerprint": fingerprint(result.content), "source": "exception",
                    "error_type": "RuntimeError"}
    assert out.messages[-1].content == "done"
    assert [r["data"]["action"] for r in out.journal.kinds("intervention")] == ["tool_exception"]


async def test_without_the_guard_the_exception_ends_the_run(tmp_path: Path) -> None:
    @tool
    def explode(q: str) -> str:
        """Always fails."""
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await run_agent(_calls({"name": "explode", "args": {"q": "x"}}), [], tmp_path / "ws", tools=[explode])


async def test_long_exception_detail_is_cut(tmp_path: Path) -> None:
    @tool
    def explode(q: str) -> str:
        """Always fails."""
        raise ValueError("x" * 5000)

    out = await run_agent(_calls({"name": "explode", "args": {"q": "x"}}), [ToolErrorHandling()],
                          tmp_path / "ws", tools=[explode])
    (result,) = _tool_messages(out.messages)
    detail = result.content.split("ValueError: ", 1)[1].split(". Continue", 1)[0]
    assert len(detail) == DETAIL_MAX_CHARS
    assert detail.endswith("…")


async def test_tool_results_are_stamped_and_keep_ids_and_artifacts(tmp_path: Path) -> None:
    @tool(response_format="content_and_artifact")
    def lookup(q: str) -> tuple[str, dict[str, str]]:
        """Looks something up."""
        return ("No results found." if q == "none" else f"answer for {q}"), {"q": q}

    @tool
    def refuse(q: str) -> str:
        """A tool error reported the ordinary way."""
        raise ToolException("Error: search is not configured")

    refuse.handle_tool_error = True
    out = await run_agent(
        _calls({"name": "lookup", "args": {"q": "a"}}, {"name": "lookup", "args": {"q": "none"}},
               {"name": "refuse", "args": {"q": "b"}}),
        [ToolErrorHandling()], tmp_path / "ws", tools=[lookup, refuse],
    )
    ok, empty, config = _tool_messages(out.messages)
    assert ok.artifact == {"q": "a"} and empty.artifact == {"q": "none"}
    assert [m.additional_kwargs[TOOL_META]["status"] for m in (ok, empty, config)] == ["ok", "empty", "config"]
    assert {m.additional_kwargs[TOOL_META]["source"] for m in (ok, empty, config)} == {"tool"}
    assert config.status == "error"


async def test_command_results_are_stamped(tmp_path: Path) -> None:
    @tool
    def handoff(q: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Returns a Command with its ToolMessage."""
        return Command(update={"messages": [ToolMessage(content="No matches", tool_call_id=tool_call_id, id="tm-1")]})

    out = await run_agent(_calls({"name": "handoff", "args": {"q": "a"}}), [ToolErrorHandling()],
                          tmp_path / "ws", tools=[handoff])
    (result,) = _tool_messages(out.messages)
    assert result.id == "tm-1"
    assert result.additional_kwargs[TOOL_META]["status"] == "empty"


def test_stamp_result_keeps_other_command_fields() -> None:
    command = Command(update={"messages": [AIMessage("x"), ToolMessage("ok", tool_call_id="c")], "todos": [1]},
                      goto="model")
    stamped = stamp_result(command)
    assert stamped.goto == "model" and stamped.update["todos"] == [1]
    assert stamped.update["messages"][0] is command.update["messages"][0]
    assert stamped.update["messages"][1].additional_kwargs[TOOL_META]["status"] == "ok"
    plain = Command(update={"todos": [1]})
    assert stamp_result(plain) is plain


class _GuardResult(AgentMiddleware):
    """A guard inner of ToolErrorHandling answering with its own stamped result."""

    async def awrap_tool_call(self, request: Any, handler: Any) -> ToolMessage:
        meta = {"status": "error", "fingerprint": "f", "source": "ReadBeforeWrite"}
        return ToolMessage(content="Error: read the file first", tool_call_id=request.tool_call["id"],
                           name=request.tool_call["name"], status="error", additional_kwargs={TOOL_META: meta})


async def test_a_guard_produced_result_keeps_its_own_meta(tmp_path: Path) -> None:
    out = await run_agent(_calls({"name": "ls", "args": {"path": "/workspace"}}),
                          [ToolErrorHandling(), _GuardResult()], tmp_path / "ws")
    (result,) = _tool_messages(out.messages)
    assert result.additional_kwargs[TOOL_META] == {"status": "error", "fingerprint": "f", "source": "ReadBeforeWrite"}


async def test_interrupts_propagate(tmp_path: Path) -> None:
    invocations: list[Any] = []

    @tool
    def ask(question: str) -> str:
        """Asks the user."""
        answer = interrupt({"question": question})
        invocations.append(answer)
        return f"user said {answer}"

    harness = GuardHarness(_calls({"name": "ask", "args": {"question": "why?"}}), [ToolErrorHandling()],
                           tmp_path / "ws", tools=[ask])
    first = await harness.run()
    assert len(first.interrupts) == 1 and first.interrupts[0].value == {"question": "why?"}
    assert not _tool_messages(first.messages)
    second = await harness.run(resume="because")
    (result,) = _tool_messages(second.messages)
    assert result.content == "user said because"
    assert result.additional_kwargs[TOOL_META]["status"] == "ok"
    assert invocations == ["because"]
