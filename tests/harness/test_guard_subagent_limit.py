"""SubagentLimit: the task calls a response and a run may make, counted from the delegation ledger;
excess calls are withheld before they run, the model is told which and why, the request grammar
stays valid, and the guard sits inside DurableContext by contract."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from guard_kit import GuardHarness, ListJournal, assert_provider_valid, final_ai, script
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from agentkeel.config import SubagentsConfig
from agentkeel.harness.context import RunContext
from agentkeel.harness.durable import durable_values
from agentkeel.harness.middleware.catalog import build_agent_chain, guard_members
from agentkeel.harness.middleware.chain import ChainError, check_order, constraints
from agentkeel.harness.middleware.grammar import grammar_violation
from agentkeel.harness.middleware.responses import WITHHELD, intended_calls, withhold
from agentkeel.harness.middleware.subagent_limit import SubagentLimit
from agentkeel.harness.stop_reasons import StopReasonCollector
from agentkeel.limits import Limits

# -- driving the guard directly ------------------------------------------------------------


def task(call_id: str, description: str = "") -> dict[str, Any]:
    return {"name": "task", "id": call_id, "args": {"description": description or f"Work {call_id}", "prompt": "Do it."}}


def other(call_id: str) -> dict[str, Any]:
    return {"name": "ls", "id": call_id, "args": {"path": "/workspace"}}


def entry(call_id: str, run_id: str | None) -> dict[str, Any]:
    return {"id": call_id, "run_id": run_id, "status": "completed", "description": "x", "subagent_type": "general-purpose"}


class Drive:
    """One guard, one run context (``run_id``, or none), and a thread whose ledger is ``ledger``."""

    def __init__(self, guard: SubagentLimit, ledger: list[dict[str, Any]] | None = None, run_id: str | None = "r1") -> None:
        self.guard = guard
        self.ledger = list(ledger or [])
        self.journal = ListJournal()
        self.collector = StopReasonCollector(self.journal.next_seq)
        self.runtime = SimpleNamespace(context=RunContext(
            thread_id="t1", run_id=run_id, workspace_root=Path("/nonexistent"), stop_reasons=self.collector,
            journal=self.journal,
        ) if run_id is not None else None)

    async def respond(self, ai: AIMessage, *extra: BaseMessage) -> ModelResponse:
        async def handler(request: ModelRequest) -> ModelResponse:
            return ModelResponse(result=[ai, *extra])

        # The thread's messages may be compacted away from the request: the ledger is in state.
        request = ModelRequest(
            model=None, messages=[HumanMessage("Go.")], runtime=self.runtime,  # type: ignore[arg-type]
            state={"messages": [], "delegations": self.ledger},  # type: ignore[typeddict-item]
        )
        return await self.guard.awrap_model_call(request, handler)

    @property
    def stop_reasons(self) -> list[dict[str, Any]]:
        return self.collector.entries if self.runtime.context is not None else self.guard._fallback_reasons.entries

    def interventions(self) -> list[dict[str, Any]]:
        return [r["data"] for r in self.journal.kinds("intervention")]


def ai_with(*calls: dict[str, Any], content: Any = "Delegating.", **kwargs: Any) -> AIMessage:
    return AIMessage(content=content, id="m1", tool_calls=list(calls),
                     response_metadata={"finish_reason": "tool_calls"}, **kwargs)


def ids(calls: list[Any]) -> list[str]:
    return [c["id"] for c in calls]


def only_ai(response: ModelResponse) -> AIMessage:
    [ai] = [m for m in response.result if isinstance(m, AIMessage)]
    return ai


def answered(ai: AIMessage) -> list[BaseMessage]:
    """The request after the response: the user turn, the response, a result for each live call."""
    return [HumanMessage("Go."), ai, *(ToolMessage("ok", tool_call_id=c["id"], name=c["name"]) for c in ai.tool_calls)]


async def test_one_response_runs_at_most_max_concurrent_task_calls() -> None:
    drive = Drive(SubagentLimit(max_concurrent=3, max_per_run=50))
    calls = [task("t1"), other("l1"), task("t2"), task("t3"), task("t4", "Check the figures"), task("t5")]
    ai = only_ai(await drive.respond(ai_with(*calls)))
    assert ids(ai.tool_calls) == ["t1", "l1", "t2", "t3"]  # order kept, the ls call untouched
    assert ids(ai.additional_kwargs[WITHHELD]["tool_calls"]) == ["t4", "t5"]
    assert ai.id == "m1" and ai.response_metadata["finish_reason"] == "tool_calls"  # calls remain
    assert "[SUBAGENT LIMIT]" in ai.content and "t4 ('Check the figures')" in ai.content and "t5" in ai.content
    assert "at most 3 task calls of one response" in ai.content
    [reason] = drive.stop_reasons
    assert reason["code"] == "subagent_limit_capped" and reason["cause"] == "m1"
    assert reason["data"] == {"dropped": ["t4", "t5"], "kept": 3, "max_concurrent": 3, "max_per_run": 50, "prior": 0}
    assert grammar_violation(None, answered(ai)) is None


async def test_the_run_budget_counts_this_runs_ledger_entries_only() -> None:
    # Four distinct entries of this run (one listed twice), three of an earlier run on the thread.
    ledger = [entry("a", "r1"), entry("b", "r1"), entry("c", "r1"), entry("d", "r1"), entry("d", "r1"),
              entry("x", "r0"), entry("y", "r0"), entry("z", "r0")]
    drive = Drive(SubagentLimit(max_concurrent=3, max_per_run=6), ledger)
    ai = only_ai(await drive.respond(ai_with(task("t1"), task("t2"), task("t3"))))
    # Cut to the remaining budget (6 - 4): the earlier run's entries would have left none.
    assert ids(ai.tool_calls) == ["t1", "t2"]
    [reason] = drive.stop_reasons
    assert reason["data"]["prior"] == 4 and reason["data"]["dropped"] == ["t3"] and reason["data"]["kept"] == 2
    assert "may delegate 6 tasks in all and has delegated 4 already" in ai.content
    assert "only the first 2 of this response run" in ai.content


async def test_without_a_run_context_every_ledger_entry_counts() -> None:
    drive = Drive(SubagentLimit(max_concurrent=3, max_per_run=4), [entry("x", "r0"), entry("y", None)], run_id=None)
    ai = only_ai(await drive.respond(ai_with(task("t1"), task("t2"), task("t3"))))
    assert ids(ai.tool_calls) == ["t1", "t2"]
    assert drive.stop_reasons[0]["data"]["prior"] == 2


async def test_a_run_out_of_budget_gets_a_final_answer_with_a_valid_grammar() -> None:
    drive = Drive(SubagentLimit(max_concurrent=3, max_per_run=2), [entry("a", "r1"), entry("b", "r1")])
    raw = [{"id": "t1", "type": "function", "function": {"name": "task", "arguments": "{}"}}]
    ai = only_ai(await drive.respond(ai_with(task("t1"), content="", additional_kwargs={"tool_calls": raw})))
    assert ai.tool_calls == [] and ai.response_metadata["finish_reason"] == "stop"
    assert "tool_calls" not in ai.additional_kwargs  # no converter can resurrect the call
    assert ai.content.startswith("[SUBAGENT LIMIT]") and "Do the remaining work yourself" in ai.content
    assert grammar_violation(None, [HumanMessage("Go."), ai]) is None
    assert drive.stop_reasons[0]["data"]["kept"] == 0


async def test_a_dropped_calls_content_block_goes_with_it() -> None:
    # Anthropic sends every tool_use block of the content as a call, whatever tool_calls says.
    blocks = [{"type": "text", "text": "Delegating."},
              {"type": "tool_use", "id": "t1", "name": "task", "input": task("t1")["args"]},
              {"type": "tool_use", "id": "t2", "name": "task", "input": task("t2")["args"]}]
    drive = Drive(SubagentLimit(max_concurrent=1, max_per_run=50))
    ai = only_ai(await drive.respond(ai_with(task("t1"), task("t2"), content=blocks)))
    assert [b.get("id") for b in ai.content if isinstance(b, dict) and b.get("type") == "tool_use"] == ["t1"]
    assert ids(ai.tool_calls) == ["t1"]
    # The same for every guard that withholds all calls (a budget, a turn limit).
    stripped = withhold(ai_with(task("t1"), task("t2"), content=blocks), "TokenBudget", "[TOKEN BUDGET EXCEEDED]")
    assert [b.get("type") for b in stripped.content if isinstance(b, dict)] == ["text", "text"]


async def test_the_reason_is_recorded_once_and_every_drop_is_journaled() -> None:
    drive = Drive(SubagentLimit(max_concurrent=1, max_per_run=50))
    await drive.respond(ai_with(task("t1"), task("t2")))
    await drive.respond(ai_with(task("t3"), task("t4")))
    assert [r["code"] for r in drive.stop_reasons] == ["subagent_limit_capped"]
    assert [(i["action"], i["dropped"]) for i in drive.interventions()] == [("withhold", ["t2"]), ("withhold", ["t4"])]


async def test_calls_within_the_bounds_and_other_tools_pass_untouched() -> None:
    drive = Drive(SubagentLimit(max_concurrent=2, max_per_run=3), [entry("a", "r1")])
    original = ai_with(task("t1"), other("l1"), other("l2"), task("t2"))
    response = await drive.respond(original)
    assert only_ai(response) is original
    ai = only_ai(await drive.respond(ai_with(other("l3"), other("l4"))))  # no task call: nothing to bound
    assert ids(ai.tool_calls) == ["l3", "l4"] and drive.stop_reasons == []


async def test_a_task_call_answered_in_the_response_is_not_counted() -> None:
    # ToolCallArguments answers a malformed call in the response itself: it never runs.
    drive = Drive(SubagentLimit(max_concurrent=1, max_per_run=50))
    error = ToolMessage("Error: malformed", tool_call_id="bad", name="task", status="error")
    response = await drive.respond(ai_with(task("bad"), task("t1")), error)
    assert ids(only_ai(response).tool_calls) == ["bad", "t1"] and drive.stop_reasons == []


async def test_the_verdict_counts_calls_another_guard_withheld() -> None:
    # An inner guard (a budget) withheld every call already: this one still records its limit, so
    # the stop reasons do not depend on which of the two sits inside.
    drive = Drive(SubagentLimit(max_concurrent=1, max_per_run=50))
    stripped = withhold(ai_with(task("t1"), task("t2")), "TokenBudget", "[TOKEN BUDGET EXCEEDED]")
    ai = only_ai(await drive.respond(stripped))
    assert ai.tool_calls == [] and ids(intended_calls(ai)) == ["t1", "t2"]
    assert [b["middleware"] for b in ai.additional_kwargs[WITHHELD]["by"]] == ["TokenBudget", "SubagentLimit"]
    assert drive.stop_reasons[0]["data"]["dropped"] == ["t2"]


def test_bounds_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrent and max_per_run"):
        SubagentLimit(max_concurrent=0, max_per_run=3)


call_lists = st.lists(st.sampled_from(["task", "ls", "read_file"]), max_size=12).map(
    lambda names: [task(f"c{i}") if n == "task" else {"name": n, "id": f"c{i}", "args": {}} for i, n in enumerate(names)]
)


@settings(max_examples=150, deadline=None)
@given(calls=call_lists, prior=st.integers(0, 12), others=st.integers(0, 5),
       max_concurrent=st.integers(1, 8), max_per_run=st.integers(1, 12))
async def test_kept_task_calls_are_the_first_that_fit_both_bounds(
    calls: list[dict[str, Any]], prior: int, others: int, max_concurrent: int, max_per_run: int
) -> None:
    ledger = [entry(f"p{i}", "r1") for i in range(prior)] + [entry(f"o{i}", "r0") for i in range(others)]
    drive = Drive(SubagentLimit(max_concurrent, max_per_run), ledger)
    ai = only_ai(await drive.respond(ai_with(*calls)))
    tasks = [c["id"] for c in calls if c["name"] == "task"]
    allowed = min(len(tasks), max_concurrent, max(0, max_per_run - prior))
    assert [c["id"] for c in ai.tool_calls if c["name"] == "task"] == tasks[:allowed]
    assert ids(ai.tool_calls) == [c["id"] for c in calls if c["name"] != "task" or c["id"] in tasks[:allowed]]
    assert len(drive.stop_reasons) == (1 if allowed < len(tasks) else 0)
    assert grammar_violation(None, answered(ai)) is None


# -- in the chain ----------------------------------------------------------------------------


def test_it_is_in_the_chain_exactly_when_the_agent_delegates() -> None:
    assert "SubagentLimit" not in [m.name for m in guard_members("lead", Limits())]
    for kind in ("lead", "subagent"):
        [guard] = [m for m in guard_members(kind, Limits(), delegation=SubagentsConfig(max_concurrent=2, max_per_run=5))
                   if isinstance(m, SubagentLimit)]
        assert (guard.max_concurrent, guard.max_per_run) == (2, 5)


def test_it_sits_inside_durable_context_by_contract() -> None:
    chain = build_agent_chain("lead", Limits(), delegation=SubagentsConfig())
    names = [m.name for m in chain.middlewares]
    assert names.index("DurableContext") < names.index("SubagentLimit")
    [fact] = [f for f in constraints("lead", list(chain.middlewares))
              if {f.outer, f.inner} == {"DurableContext", "SubagentLimit"}]
    assert (fact.outer, fact.inner, fact.rule, fact.resource) == ("DurableContext", "SubagentLimit", 2, "model_response")
    # It also sees the calls after the protocol repairs.
    assert names.index("SubagentLimit") < names.index("SafetyFinishReason")
    by_name = {m.name: m for m in chain.middlewares}
    with pytest.raises(ChainError, match=r"rule 2 .*DurableContext must be outer of SubagentLimit"):
        check_order("lead", [by_name["SubagentLimit"], by_name["DurableContext"]])


def _task_tool(counter: Counter[str]) -> BaseTool:
    def task(description: str, prompt: str = "", subagent_type: str = "general-purpose") -> str:
        counter[description] += 1
        return f"Finished: {description}"

    return tool("task", description="Delegate work to a subagent.")(task)


def _turn(say: str, *descriptions: str) -> dict[str, Any]:
    return {"say": say, "tool_calls": [{"name": "task", "args": {"description": d}} for d in descriptions]}


async def test_a_delegating_run_is_bounded_end_to_end(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    turns = [
        _turn("Three at once.", "A", "B", "C"),  # max_concurrent 2: C is dropped
        _turn("Two more.", "D", "E"),  # 2 made, max_per_run 3: E is dropped
        _turn("One more.", "F"),  # budget spent: no call remains, the run ends on this answer
        {"say": "Here is what A, B and D found."},  # TerminalResponse's one tool-less call
        _turn("Next run: two.", "G", "H"),  # a new run on the thread has its own budget
        {"say": "Done again."},
    ]
    chain = build_agent_chain("lead", Limits(), strict_grammar=True, delegation=SubagentsConfig(max_concurrent=2, max_per_run=3))
    harness = GuardHarness(script(*turns), list(chain.middlewares), tmp_path / "ws", tools=[_task_tool(counter)])
    first = await harness.run("Research.", run_id="r1")
    assert counter == Counter({"A": 1, "B": 1, "D": 1})
    assert_provider_valid(first)
    assert final_ai(first).text == "Here is what A, B and D found."
    assert [r["code"] for r in first.stop_reasons] == ["subagent_limit_capped"]
    assert first.stop_reasons[0]["data"]["kept"] == 2 and first.stop_reasons[0]["data"]["prior"] == 0
    assert len([r for r in first.journal.kinds("intervention") if r["data"]["middleware"] == "SubagentLimit"]) == 3
    # Only the calls that ran are in the ledger (DurableContext saw the final response).
    state = await harness.graph.aget_state({"configurable": {"thread_id": harness.thread_id}})
    ledger = durable_values(state.values)["delegations"]
    assert sorted(e["description"] for e in ledger) == ["A", "B", "D"]

    second = await harness.run("More.", run_id="r2")
    assert counter["G"] == 1 and counter["H"] == 1
    assert [r["code"] for r in second.stop_reasons] == ["subagent_limit_capped"]  # still r1's only
