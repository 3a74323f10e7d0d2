"""ToolProgress: warn about, then block, a tool that keeps failing, finding nothing or repeating itself.

Driven through the real agent loop with a custom tool whose outputs the test controls and whose
invocations it counts; ToolErrorHandling (inner) stamps the verdicts ToolProgress reads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from guard_kit import Outcome, RetryOnce, run_agent
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException, tool

from agentkeel.harness.middleware.keys import TOOL_META
from agentkeel.harness.middleware.responses import is_hint
from agentkeel.harness.middleware.tool_error_handling import ToolErrorHandling
from agentkeel.harness.middleware.tool_progress import ToolProgress, similarity, tokens
from agentkeel.limits import ToolProgressLimits

LIMITS = ToolProgressLimits()  # threshold 3, escalation 2: warned at 3, blocked at 5


class Searcher:
    """A ``search`` tool returning what ``reply(n)`` says for its n-th invocation (from 1)."""

    def __init__(self, reply: Callable[[int], str]) -> None:
        self.calls = 0
        self._reply = reply

    @property
    def tool(self) -> BaseTool:
        @tool
        def search(query: str) -> str:
            """Searches the web."""
            self.calls += 1
            text = self._reply(self.calls)
            if text.startswith("raise:"):
                raise ToolException(text.removeprefix("raise:"))
            if text.startswith("crash:"):
                raise RuntimeError(text.removeprefix("crash:"))
            return text

        search.handle_tool_error = True  # ToolException -> error ToolMessage, like the workspace tools
        return search


def _script(n: int, name: str = "search") -> dict[str, Any]:
    return {"agents": {"lead": [
        {"tool_calls": [{"name": name, "args": {"query": "q{turn}"}, "id": "call-{turn}"}], "repeat": n},
        {"say": "done"},
    ]}}


async def _run(tmp_path: Path, searcher: Searcher, n: int, limits: ToolProgressLimits = LIMITS,
               extra: list[Any] | None = None) -> Outcome:
    middleware = [ToolProgress(limits), *(extra or []), ToolErrorHandling()]
    return await run_agent(_script(n), middleware, tmp_path / "ws", tools=[searcher.tool])


def _results(out: Outcome) -> list[ToolMessage]:
    return [m for m in out.messages if isinstance(m, ToolMessage)]


def _hint(request: list[BaseMessage]) -> str | None:
    last = request[-1]
    return str(last.content) if is_hint(last) and last.name == "progress_hint" else None


def _actions(out: Outcome) -> list[str]:
    return [r["data"]["action"] for r in out.journal.kinds("intervention")]


LONG = "The quarterly report lists revenue growth across seven regions with detailed commentary on margins"


async def test_repeated_empty_results_warn_then_block(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: "No results found.")
    out = await _run(tmp_path, searcher, 7)
    assert searcher.calls == 5  # calls 6 and 7 were answered without running the tool
    results = _results(out)
    assert [r.content.startswith("[TOOL_BLOCKED] search:") for r in results] == [False] * 5 + [True] * 2
    assert all(r.status == "error" and r.additional_kwargs[TOOL_META]["source"] == "ToolProgress" for r in results[5:])
    assert [r.tool_call_id for r in results[5:]] == ["call-6", "call-7"]
    # requests[k] is the request after the k-th tool result: hints after the 3rd, 4th (warn) and 5th (block).
    hints = [_hint(r) for r in out.requests]
    assert hints[:3] == [None, None, None]
    assert hints[3] is not None and "returned no results 3 times in a row" in hints[3]
    assert hints[4] is not None and "4 times in a row" in hints[4]
    assert hints[5] is not None and "blocked" in hints[5]
    assert hints[6:] == [None, None]
    assert not any(is_hint(m) for m in out.messages)  # never written to state
    assert out.codes == ["tool_blocked"]
    (entry,) = out.stop_reasons
    assert entry["source"] == "ToolProgress" and entry["cause"] == "call-5"
    assert entry["data"] == {"tool": "search", "reason": "it kept returning no results", "problems": 5}
    assert _actions(out) == ["warn", "warn", "block"]
    assert out.messages[-1].content == "done"


async def test_the_same_output_again_and_again_is_a_problem(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: LONG)
    out = await _run(tmp_path, searcher, 8)
    # call 1 is new; calls 2..6 repeat it (problems 1..5): blocked after the 6th invocation.
    assert searcher.calls == 6
    assert out.codes == ["tool_blocked"]
    assert out.stop_reasons[0]["data"]["reason"] == "it kept returning the same output"
    assert "returned the same output as before 3 times" in (_hint(out.requests[4]) or "")


async def test_near_identical_output_counts_and_new_output_resets(tmp_path: Path) -> None:
    # Calls 2-4 differ from call 1 by one word of 15 (weighted Jaccard 14/16 >= 0.8); call 5 is new.
    replies = {1: LONG + " alpha", 2: LONG + " beta", 3: LONG + " gamma", 4: LONG + " delta",
               5: "Completely different findings about coastal erosion and sediment transport in estuaries today"}
    searcher = Searcher(lambda n: replies.get(n, replies[5]))
    out = await _run(tmp_path, searcher, 5)
    assert searcher.calls == 5
    assert out.codes == []
    assert _hint(out.requests[4]) is not None  # warned after call 4 (3 near-duplicates)
    assert _hint(out.requests[5]) is None  # call 5 reset the tool to active
    assert _actions(out) == ["warn"]


async def test_short_outputs_are_not_compared_by_similarity(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: f"result number {n} here")  # < min_words words, all different
    out = await _run(tmp_path, searcher, 6)
    assert searcher.calls == 6 and out.codes == [] and _actions(out) == []


async def test_an_ok_result_resets_the_count(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: f"Found page {n}: a fresh answer" if n % 3 == 0 else "No results found.")
    out = await _run(tmp_path, searcher, 9)
    assert searcher.calls == 9 and out.codes == [] and _actions(out) == []


@pytest.mark.parametrize(("failure", "reason"), [
    ("raise:HTTP 401 Unauthorized", "its credentials were rejected (authentication failed)"),
    ("crash:search backend is not configured", "it is not configured or not available in this environment"),
])
async def test_auth_and_config_failures_block_at_once(tmp_path: Path, failure: str, reason: str) -> None:
    searcher = Searcher(lambda n: failure)
    out = await _run(tmp_path, searcher, 4)
    assert searcher.calls == 1
    first, *blocked = _results(out)
    assert first.status == "error" and not first.content.startswith("[TOOL_BLOCKED]")
    assert [b.content.startswith(f"[TOOL_BLOCKED] search: {reason}") for b in blocked] == [True] * 3
    assert out.codes == ["tool_blocked"]
    assert out.stop_reasons[0]["data"] == {"tool": "search", "reason": reason, "problems": 1}
    assert out.stop_reasons[0]["cause"] == "call-1"
    assert "now blocked" in (_hint(out.requests[1]) or "")


async def test_errors_and_rate_limits_count_as_problems(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: "raise:429 too many requests" if n % 2 else "crash:socket closed")
    out = await _run(tmp_path, searcher, 6)
    assert searcher.calls == 5 and out.codes == ["tool_blocked"]
    # The last problem (a rate limit) names the reason.
    assert out.stop_reasons[0]["data"]["reason"] == "it kept being rate limited"


class _GuardAnswers(AgentMiddleware):
    """Another guard answering every call itself, with its own stamp."""

    async def awrap_tool_call(self, request: Any, handler: Any) -> ToolMessage:
        meta = {"status": "error", "fingerprint": "f", "source": "ReadBeforeWrite"}
        return ToolMessage("Error: refused", tool_call_id=request.tool_call["id"], name=request.tool_call["name"],
                           status="error", additional_kwargs={TOOL_META: meta})


async def test_results_produced_by_other_guards_are_not_counted(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: "No results found.")
    out = await _run(tmp_path, searcher, 7, extra=[_GuardAnswers()])
    assert searcher.calls == 0
    assert out.codes == [] and _actions(out) == []
    assert all(r.content == "Error: refused" for r in _results(out))


async def test_exempt_tools_pass_through(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: "No results found.")
    out = await _run(tmp_path, searcher, 7, limits=ToolProgressLimits(exempt_tools=["search"]))
    assert searcher.calls == 7 and out.codes == [] and _actions(out) == []


async def test_tools_are_tracked_separately(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: "No results found.")

    @tool
    def fetch(url: str) -> str:
        """Fetches a page."""
        return "No results found."

    script = {"agents": {"lead": [
        {"tool_calls": [{"name": "search", "args": {"query": "a"}}, {"name": "fetch", "args": {"url": "u{turn}"}}],
         "repeat": 2},
        {"tool_calls": [{"name": "search", "args": {"query": "b"}}], "repeat": 3},
        {"say": "done"},
    ]}}
    out = await run_agent(script, [ToolProgress(LIMITS), ToolErrorHandling()], tmp_path / "ws",
                          tools=[searcher.tool, fetch])
    assert searcher.calls == 5
    assert [e["data"]["tool"] for e in out.stop_reasons] == ["search"]


async def test_a_missing_stamp_is_an_ordering_error(tmp_path: Path) -> None:
    searcher = Searcher(lambda n: "hello")
    with pytest.raises(RuntimeError, match="ToolErrorHandling must run inner of ToolProgress"):
        await run_agent(_script(1), [ToolProgress(LIMITS)], tmp_path / "ws", tools=[searcher.tool])


async def test_hint_survives_a_failed_model_call(tmp_path: Path) -> None:
    """The hint is committed only after the provider answered, so a retried call carries it."""
    searcher = Searcher(lambda n: "No results found.")
    script = {"agents": {"lead": [
        {"tool_calls": [{"name": "search", "args": {"query": "q{turn}"}}], "repeat": 3},
        {"raise": {"kind": "server_error"}},
        {"say": "done"},
    ]}}
    out = await run_agent(script, [RetryOnce(), ToolProgress(LIMITS), ToolErrorHandling()], tmp_path / "ws",
                          tools=[searcher.tool])
    assert [_hint(r) is not None for r in out.requests] == [False, False, False, True, True]
    assert out.messages[-1].content == "done"
    assert not any(isinstance(m, HumanMessage) and m.name == "progress_hint" for m in out.messages)


# -- pure helpers ------------------------------------------------------------------------------


def test_tokens_count_every_word_number_and_mark_of_the_whole_text() -> None:
    assert tokens("An OX ate 2 hay, hay") == {"An": 1, "OX": 1, "ate": 1, "2": 1, "hay": 2, ",": 1}
    assert tokens("x" * 9000 + " id 7")["7"] == 1  # nothing past a scan window is ignored
    # Short tokens and numbers make contents different (a stripped word set called these equal).
    assert similarity(tokens("id 1 ok"), tokens("id 2 ok")) == 0.5


@given(st.text(max_size=60), st.text(max_size=60))
def test_similarity_is_symmetric_and_bounded(a: str, b: str) -> None:
    ta, tb = tokens(a), tokens(b)
    assert similarity(ta, tb) == similarity(tb, ta)
    assert 0.0 <= similarity(ta, tb) <= 1.0
    assert similarity(ta, ta) == 1.0


async def test_identical_confirmations_of_an_action_tool_are_not_stagnation(tmp_path: Path) -> None:
    from agentkeel.harness.middleware.read_before_write import ReadBeforeWrite
    from agentkeel.harness.middleware.tool_error_handling import ToolErrorHandling
    from agentkeel.limits import ToolProgressLimits

    path = "/workspace/log.md"
    turns = []
    for _ in range(7):  # the same append, each time after a fresh read: "Appended 4 bytes to ..." x7
        turns.append({"tool_calls": [{"name": "read_file", "args": {"path": path}}]})
        turns.append({"tool_calls": [{"name": "write_file", "args": {"path": path, "content": "row\n", "append": True}}]})
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "log.md").write_text("")
    chain = [ReadBeforeWrite(), ToolProgress(ToolProgressLimits()), ToolErrorHandling()]
    out = await run_agent({"agents": {"lead": [*turns, {"say": "done"}]}}, chain, tmp_path / "ws")
    assert out.codes == []
    assert (tmp_path / "ws" / "log.md").read_text() == "row\n" * 7
    # Treated as an information tool, the same confirmation would have blocked it.
    (tmp_path / "ws2").mkdir()
    (tmp_path / "ws2" / "log.md").write_text("")
    chain = [ReadBeforeWrite(), ToolProgress(ToolProgressLimits(action_tools=[])), ToolErrorHandling()]
    out = await run_agent({"agents": {"lead": [*turns, {"say": "done"}]}}, chain, tmp_path / "ws2")
    assert out.codes == ["tool_blocked"]
