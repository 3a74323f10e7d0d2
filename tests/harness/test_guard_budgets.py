"""TokenBudget and TurnLimit on the real agent loop, and the order independence of the three
response guards (LoopDetection, TokenBudget, TurnLimit)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from guard_kit import KeepGoing, RetryOnce, assert_provider_valid, counting_tool, final_ai, hints, run_agent, script
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from agentkeel.harness.middleware.base import KeelMiddleware
from agentkeel.harness.middleware.loop_detection import LoopDetection
from agentkeel.harness.middleware.responses import WITHHELD, is_hint, was_stripped
from agentkeel.harness.middleware.token_budget import TokenBudget, pressure
from agentkeel.harness.middleware.turn_limit import TurnLimit
from agentkeel.harness.stop_reasons import CAUSE_PRECEDENCE, primary_code
from agentkeel.harness.tools._support import Runtime
from agentkeel.limits import LoopDetectionLimits, TokenBudgetLimits, TurnLimits


def probe_turn(input_tokens: int, output_tokens: int = 10, say: str = "", n: Any = "{turn}") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "tool_calls": [{"name": "probe", "args": {"n": n}}], "usage": {"input": input_tokens, "output": output_tokens},
    }
    return {**entry, "say": say} if say else entry










# -- TokenBudget --------------------------------------------------------------------------


def test_pressure_picks_the_worst_budget() -> None:
    limits = TokenBudgetLimits(max_tokens=10_000, max_input_tokens=5_000, max_output_tokens=100)
    assert pressure(limits, 4_000, 50).kind == "input"
    assert pressure(limits, 1_000, 90).kind == "output"
    assert pressure(TokenBudgetLimits(max_tokens=10_000), 9_000, 500).fraction == 0.95


async def test_budget_warns_once_then_caps_once(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    outcome = await run_agent(
        script(probe_turn(500), probe_turn(350), probe_turn(50), probe_turn(100, say="partial"), probe_turn(10)),
        [TokenBudget(TokenBudgetLimits(max_tokens=1000, warn_fraction=0.8)), KeepGoing(times=1)],
        tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert [len(hints(r, "budget_warning")) for r in outcome.requests] == [0, 0, 1, 0, 0]
    warning = outcome.requests[2][-1]  # after response 2 (870 of 1000 tokens), at the very end
    assert is_hint(warning) and "[TOKEN BUDGET WARNING] You have used 870 of your 1000 total" in str(warning.content)

    assert counter["probe"] == 3  # responses 4 and 5 were over budget and withheld
    assert outcome.codes == ["token_capped"]
    entry = outcome.stop_reasons[0]
    assert entry["data"] == {"kind": "total", "used": 1040, "budget": 1000}
    assert entry["cause"] == "msg-k-lead-0-4" and entry["source"] == "TokenBudget"
    stripped = [m for m in outcome.messages if isinstance(m, AIMessage) and was_stripped(m)]
    assert [m.id for m in stripped] == ["msg-k-lead-0-4", "msg-k-lead-0-5"]
    assert stripped[0].content.startswith("partial") and "[TOKEN BUDGET EXCEEDED]" in stripped[0].content
    final = final_ai(outcome)
    assert final.tool_calls == [] and "tool_calls" not in final.additional_kwargs
    assert_provider_valid(outcome)


async def test_budget_counts_the_current_response_and_input_limit(tmp_path: Path) -> None:
    """The meter already holds this response's usage when the handler returns: no call late."""
    counter: Counter[str] = Counter()
    limits = TokenBudgetLimits(max_tokens=100_000, max_input_tokens=1_000)
    outcome = await run_agent(
        script(probe_turn(1_200, 1)), [TokenBudget(limits)], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert counter["probe"] == 0
    assert outcome.stop_reasons[0]["data"] == {"kind": "input", "used": 1_200, "budget": 1_000}
    assert len(outcome.requests) == 1


async def test_budget_reacts_to_usage_from_another_source_on_the_next_response(tmp_path: Path) -> None:
    """A tool adds 5000 input tokens to the run meter (as subagent calls do); the very next
    response is withheld although the lead's own responses used only 220 tokens."""
    counter: Counter[str] = Counter()

    @tool
    def spend(runtime: Runtime) -> str:
        """Spend tokens elsewhere in the run."""
        runtime.context.usage.input_tokens += 5_000
        return "spent"

    outcome = await run_agent(
        script({"tool_calls": [{"name": "spend", "args": {}}], "usage": {"input": 100, "output": 10}}, probe_turn(100)),
        [TokenBudget(TokenBudgetLimits(max_tokens=2_000))], tmp_path / "ws",
        tools=[spend, counting_tool("probe", counter)],
    )
    assert counter["probe"] == 0
    assert outcome.codes == ["token_capped"]
    assert outcome.stop_reasons[0]["data"] == {"kind": "total", "used": 5_220, "budget": 2_000}
    assert outcome.stop_reasons[0]["cause"] == "msg-k-lead-0-2"


async def test_budget_without_a_meter_sums_the_responses_it_saw() -> None:
    guard = TokenBudget(TokenBudgetLimits(max_tokens=1_000))
    usage = iter([(600, 10), (400, 10)])

    async def handler(request: ModelRequest) -> ModelResponse:
        i, o = next(usage)
        ai = AIMessage(
            content="", id=f"m{i}", tool_calls=[{"name": "ls", "args": {}, "id": f"c{i}"}],
            usage_metadata={"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
        )
        return ModelResponse(result=[ai])

    request = ModelRequest(model=None, messages=[HumanMessage("hi")], runtime=None)  # type: ignore[arg-type]
    first = (await guard.awrap_model_call(request, handler)).result[0]
    second = (await guard.awrap_model_call(request, handler)).result[0]
    assert first.tool_calls and not second.tool_calls
    assert second.additional_kwargs[WITHHELD]["tool_calls"][0]["id"] == "c400"
    [entry] = guard._fallback_reasons.entries
    assert entry["data"] == {"kind": "total", "used": 1_020, "budget": 1_000} and entry["cause"] == "m400"


async def test_budget_does_not_cap_a_final_answer(tmp_path: Path) -> None:
    outcome = await run_agent(
        script({"say": "All done.", "usage": {"input": 5_000, "output": 10}}),
        [TokenBudget(TokenBudgetLimits(max_tokens=1_000))], tmp_path / "ws",
    )
    assert outcome.codes == [] and final_ai(outcome).content == "All done."


# -- TurnLimit ----------------------------------------------------------------------------


async def test_turn_limit_caps_once_and_keeps_the_text(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    outcome = await run_agent(
        script(probe_turn(10, say="partial {turn}") | {"repeat": "forever"}),
        [TurnLimit(TurnLimits(max_turns=3)), KeepGoing(times=1)], tmp_path / "ws",
        tools=[counting_tool("probe", counter)],
    )
    assert counter["probe"] == 2
    assert outcome.codes == ["turn_capped"]
    assert outcome.stop_reasons[0]["data"] == {"max_turns": 3, "turns": 3}
    assert outcome.stop_reasons[0]["cause"] == "msg-k-lead-0-3"
    stripped = [m for m in outcome.messages if isinstance(m, AIMessage) and was_stripped(m)]
    assert [m.id for m in stripped] == ["msg-k-lead-0-3", "msg-k-lead-0-4"]
    assert stripped[0].content.startswith("partial 3") and "[TURN LIMIT]" in stripped[0].content
    assert_provider_valid(outcome)


async def test_turn_limit_leaves_a_final_answer_alone(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    outcome = await run_agent(
        script(probe_turn(10), {"say": "done"}), [TurnLimit(TurnLimits(max_turns=2))], tmp_path / "ws",
        tools=[counting_tool("probe", counter)],
    )
    assert outcome.codes == [] and final_ai(outcome).content == "done" and counter["probe"] == 1


async def test_turn_limit_counts_successful_model_calls_not_attempts(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    guard = TurnLimit(TurnLimits(max_turns=2))
    outcome = await run_agent(
        script({"raise": {"kind": "rate_limit"}}, probe_turn(10), probe_turn(10)),
        [RetryOnce(), guard], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert guard.turns == 2 and counter["probe"] == 1
    assert outcome.stop_reasons[0]["data"] == {"max_turns": 2, "turns": 2}


# -- order independence -------------------------------------------------------------------


def _guards() -> dict[str, Callable[[], KeelMiddleware]]:
    return {
        "loop": lambda: LoopDetection(LoopDetectionLimits(warn_threshold=2, hard_limit=2)),
        "budget": lambda: TokenBudget(TokenBudgetLimits(max_tokens=1_000)),
        "turns": lambda: TurnLimit(TurnLimits(max_turns=2)),
    }


CHAINS = [p for size in (2, 3) for p in itertools.permutations(_guards(), size)]
CODES = {"loop": "loop_capped", "budget": "token_capped", "turns": "turn_capped"}


@pytest.mark.parametrize("chain", CHAINS, ids="-".join)
async def test_guards_decide_the_same_in_any_order(chain: tuple[str, ...], tmp_path: Path) -> None:
    """Response 2 repeats response 1's call set, crosses the budget and is the last turn: every
    guard in the chain records its reason, whatever the order, and the primary is the same."""
    counter: Counter[str] = Counter()
    factories = _guards()
    outcome = await run_agent(
        script(probe_turn(400, n=1, say="first"), probe_turn(700, n=1, say="second")),
        [factories[name]() for name in chain], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    expected = sorted(CODES[name] for name in chain)
    assert sorted(outcome.codes) == expected
    assert {e["cause"] for e in outcome.stop_reasons} == {"msg-k-lead-0-2"}
    assert primary_code(outcome.stop_reasons) == min(expected, key=CAUSE_PRECEDENCE.index)
    final = final_ai(outcome)
    assert final.id == "msg-k-lead-0-2" and final.tool_calls == []
    assert len(final.additional_kwargs[WITHHELD]["tool_calls"]) == 1
    assert sorted(b["middleware"] for b in final.additional_kwargs[WITHHELD]["by"]) == sorted(
        type(factories[name]()).__name__ for name in chain
    )
    assert counter["probe"] == 1
