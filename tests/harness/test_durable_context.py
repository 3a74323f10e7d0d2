"""DurableContext on the real agent loop (strict scripted model, the default chain): the ledger is
captured from ``task`` calls and their structured results, skill reads and the original request
are captured once, entries never outlive their run ``in_progress``, and a compacted thread's next
request is exactly: one system prompt (the agent's first, then the rules), the data message with
what the tail no longer shows, the tail."""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness, script
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.harness.compaction import choose_cut, new_compaction
from agentkeel.harness.durable import durable_values
from agentkeel.harness.middleware.catalog import build_agent_chain
from agentkeel.harness.middleware.durable_context import OTHER_RUN_ENDED, projected
from agentkeel.harness.middleware.keys import SUBAGENT_RESULT
from agentkeel.harness.middleware.responses import hint_message
from agentkeel.harness.projection import DATA_ID, DURABLE_CONTEXT_NAME, RULES, RULES_ID
from agentkeel.harness.skills import split_front_matter
from agentkeel.harness.state import agent_state_schema
from agentkeel.harness.tools import build_tools
from agentkeel.limits import Limits
from agentkeel.runtime.checkpoints import StateAccessor

SKILL_BODY = "# Research skill\nAlways cite the page you quote."
SKILL_FILE = "---\nname: research\ndescription: How to research.\n---\n" + SKILL_BODY
SKILL_SHA = hashlib.sha256(SKILL_FILE.encode()).hexdigest()


def _task_tool() -> BaseTool:
    """Stands in for the subagent tool: its outcome comes from ``subagent_type``."""

    def task(description: str, prompt: str = "", subagent_type: str = "general-purpose") -> tuple[str, dict[str, Any]]:
        if subagent_type == "broken":
            raise ToolException("the subagent crashed")
        if subagent_type == "capped":
            meta = {"status": "capped", "stop_reason": "turn_capped", "brief": "half the claims checked", "sha256": "ab" * 32}
            return "partial findings", {SUBAGENT_RESULT: meta}
        # The text says "failed", the result succeeded: the ledger never reads the text.
        return f"status: failed (just kidding) {description}", {}

    made = tool("task", description="Delegate work to a subagent.", response_format="content_and_artifact")(task)
    made.handle_tool_error = False
    return made


def _skill_reader() -> BaseTool:
    """A ``read_file`` that serves one skill as the skills mount does (artifact ``skill``)."""

    def read_file(path: str) -> tuple[str, dict[str, Any]]:
        if not path.startswith("/skills/research/"):
            raise ToolException(f"no such file: {path}")
        skill = {"name": "research", "path": path, "description": "How to research.", "sha256": SKILL_SHA}
        return SKILL_FILE, {"sha256": SKILL_SHA, "path": path, "skill": skill}

    return tool("read_file", description="Read a file.", response_format="content_and_artifact")(read_file)


def _harness(tmp_path: Path, turns: list[dict[str, Any]], **kwargs: Any) -> GuardHarness:
    tools = [_task_tool(), _skill_reader(), *(t for t in build_tools(bash_enabled=False) if t.name in ("write_file", "ls"))]
    chain = build_agent_chain("lead", Limits(), strict_grammar=True).for_agent()
    return GuardHarness(script(*turns), chain, tmp_path / "ws", tools=tools, **kwargs)


async def _durable(harness: GuardHarness) -> dict[str, Any]:
    state = await harness.graph.aget_state({"configurable": {"thread_id": harness.thread_id}})
    return durable_values(state.values)


def _task(call_id: str, description: str, subagent_type: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"description": description, "prompt": f"Please {description.lower()}"}
    if subagent_type:
        args["subagent_type"] = subagent_type
    return {"name": "task", "id": call_id, "args": args}


DELEGATING = [
    {"say": "Delegating.", "tool_calls": [
        _task("call-a", "Research the claims"), _task("call-b", "Check the figures", "capped"),
        _task("call-c", "Find the dataset", "broken"),
    ]},
    {"say": "All three came back."},
]


async def test_task_calls_and_their_structured_results_make_the_ledger(tmp_path: Path) -> None:
    harness = _harness(tmp_path, DELEGATING)
    out = await harness.run("Analyse the paper.", run_id="r1")
    ledger = {e["id"]: e for e in (await _durable(harness))["delegations"]}
    assert list(ledger) == ["call-a", "call-b", "call-c"]
    ai = next(m for m in out.messages if isinstance(m, AIMessage) and m.tool_calls)
    for entry in ledger.values():
        assert entry["run_id"] == "r1" and entry["message_id"] == ai.id
        assert datetime.fromisoformat(entry["created_at"]).utcoffset() is not None
    a, b, c = ledger["call-a"], ledger["call-b"], ledger["call-c"]
    assert (a["status"], a["description"], a["subagent_type"]) == ("completed", "Research the claims", "general-purpose")
    assert a.get("stop_reason") is None and a.get("result_brief") is None  # no metadata: nothing invented
    assert (b["status"], b["stop_reason"], b["result_brief"], b["result_sha256"]) == (
        "capped", "turn_capped", "half the claims checked", "ab" * 32)
    assert (c["status"], c["subagent_type"]) == ("failed", "broken")


async def test_a_task_call_is_in_progress_in_the_checkpoint_before_its_tool_runs(tmp_path: Path) -> None:
    harness = _harness(tmp_path, DELEGATING)
    await harness.run("Analyse the paper.", run_id="r1")
    history = [s async for s in harness.graph.aget_state_history({"configurable": {"thread_id": "t1"}})]
    before_tools = [s for s in history if s.next and set(s.next) == {"tools"}]  # one task per call
    assert before_tools, "a checkpoint between the model step and the tools"
    ledger = durable_values(before_tools[-1].values)["delegations"]
    assert [(e["id"], e["status"]) for e in ledger] == [(i, "in_progress") for i in ("call-a", "call-b", "call-c")]


async def test_withheld_task_calls_are_not_delegations(tmp_path: Path) -> None:
    # The turn limit withholds the calls of the turn that reaches it: they never run.
    chain = build_agent_chain("lead", Limits(turn_limit={"max_turns": 1}), strict_grammar=True).for_agent()
    harness = GuardHarness(script(*DELEGATING), chain, tmp_path / "ws", tools=[_task_tool()])
    await harness.run("Analyse the paper.")
    assert (await _durable(harness))["delegations"] == []


async def test_another_runs_open_entries_are_closed_at_this_runs_first_model_call(tmp_path: Path) -> None:
    harness = _harness(tmp_path, [{"say": "Nothing to do."}])
    await harness.run("Hello.", run_id="r0")  # creates the thread
    config = {"configurable": {"thread_id": "t1"}}
    stale = {"id": "old", "run_id": "r0", "status": "in_progress", "description": "Old work", "subagent_type": "x"}
    mine = {"id": "mine", "run_id": "r2", "status": "in_progress", "description": "My work", "subagent_type": "x"}
    done = {"id": "done", "run_id": "r0", "status": "completed", "description": "Done work", "subagent_type": "x"}
    accessor = StateAccessor(harness.graph, harness.saver, mode="full")
    await accessor.amutate("t1", {"delegations": [stale, mine, done]})
    await harness.run("Carry on.", run_id="r2")
    ledger = {e["id"]: e for e in (await _durable(harness))["delegations"]}
    # Another run's entry is closed when this run calls its model; this run's own are the worker's
    # to settle when the run ends (tests/runtime/test_runtime_delegations.py).
    assert (ledger["old"]["status"], ledger["old"]["stop_reason"]) == ("cancelled", OTHER_RUN_ENDED)
    assert ledger["mine"]["status"] == "in_progress"
    assert ledger["done"]["status"] == "completed" and ledger["done"].get("stop_reason") is None
    state = await harness.graph.aget_state(config)
    assert [m.type for m in state.values["messages"]].count("human") == 2


async def test_the_original_request_is_captured_once_and_bounded(tmp_path: Path) -> None:
    harness = _harness(tmp_path, [{"say": "Noted.", "repeat": 2}])
    first = "Write the report. " + "x" * 5000
    out = await harness.run(first, run_id="r1")
    await harness.run("Also add a chart.", run_id="r2")
    original = (await _durable(harness))["original_request"]
    assert original["id"] == out.messages[0].id
    assert original["text"] == first[:4000]


async def test_skill_reads_are_captured_with_their_body_once(tmp_path: Path) -> None:
    read = {"name": "read_file", "args": {"path": "/skills/research/SKILL.md"}}
    missing = {"name": "read_file", "args": {"path": "/skills/nope/SKILL.md"}}
    harness = _harness(tmp_path, [
        {"say": "Loading.", "tool_calls": [read, missing]},
        {"say": "Loading again.", "tool_calls": [read]},
        {"say": "Ready."},
    ])
    out = await harness.run("Research it.")
    skills = (await _durable(harness))["skills"]
    reads = [m for m in out.messages if isinstance(m, ToolMessage) and m.status != "error"]
    assert len(skills) == 1  # one entry per name: the newest read
    (entry,) = skills
    assert entry == {
        "name": "research", "path": "/skills/research/SKILL.md", "description": "How to research.",
        "sha256": SKILL_SHA, "body": split_front_matter(SKILL_FILE)[1], "message_id": reads[-1].id, "tool_call_id": reads[-1].tool_call_id,
    }


# -- a compacted thread ----------------------------------------------------------------------


COMPACTED_RUN_1 = [
    {"say": "Delegating.", "tool_calls": [_task("call-a", "Research the claims")]},
    {"say": "Loading the skill.", "tool_calls": [{"name": "read_file", "args": {"path": "/skills/research/SKILL.md"}}]},
    {"say": "First part done."},
]
# The second run's request must still show the delegation (the tail no longer does).
COMPACTED_RUN_2 = [{"say": "Second part done.", "expect": {"contains": "[completed] Research the claims"}}]


async def _compact_all(harness: GuardHarness, summary: str) -> list[BaseMessage]:
    accessor = StateAccessor(harness.graph, harness.saver, mode=harness_mode(harness))
    snapshot = await accessor.aget(harness.thread_id)
    assert snapshot is not None
    messages = snapshot.values["messages"]
    record = new_compaction(messages, len(messages), summary, None, model="scripted", at="2026-01-01T00:00:00+00:00")
    await accessor.amutate(harness.thread_id, {"compaction": record})
    return list(messages)


def harness_mode(harness: GuardHarness) -> Any:
    return "delta" if harness.state_schema is agent_state_schema("delta") else "full"


async def _compacted_thread(tmp_path: Path, **kwargs: Any) -> tuple[GuardHarness, list[BaseMessage]]:
    harness = _harness(tmp_path, [*COMPACTED_RUN_1, *COMPACTED_RUN_2], **kwargs)
    await harness.run("Analyse the paper and report its claims.", run_id="r1")
    compacted = await _compact_all(harness, "The user asked for an analysis; a subagent researched the claims.")
    await harness.run("Now write the report.", run_id="r2")
    return harness, compacted


async def test_a_compacted_threads_request_is_system_then_data_then_tail(tmp_path: Path) -> None:
    harness, compacted = await _compacted_thread(tmp_path)
    request = harness.log.requests[-1]
    assert [type(m) for m in request] == [SystemMessage, HumanMessage, HumanMessage]
    system, data, latest = request
    assert str(system.content) == "You are a test agent.\n\n" + RULES  # the agent's own prompt first
    assert (data.id, data.name) == (DATA_ID, DURABLE_CONTEXT_NAME)
    text = str(data.content)
    assert "a subagent researched the claims" in text  # the summary
    assert "Analyse the paper and report its claims." in text  # the original request
    assert "[completed] Research the claims (via general-purpose; task call-a)" in text  # the ledger
    assert "Always cite the page you quote." in text  # the skill body
    assert "Now write the report." in str(latest.content) and "BEGIN USER INPUT" in str(latest.content)
    # The thread keeps every message: the projection changed the request only.
    state = await harness.graph.aget_state({"configurable": {"thread_id": "t1"}})
    messages = state.values["messages"]
    assert [m.id for m in messages[: len(compacted)]] == [m.id for m in compacted]
    assert len(messages) == len(compacted) + 2
    assert not any(m.id in (DATA_ID, RULES_ID) for m in messages)


async def test_the_tail_showing_a_delegation_keeps_it_out_of_the_data_message(tmp_path: Path) -> None:
    harness = _harness(tmp_path, [
        {"say": "Delegating.", "tool_calls": [_task("call-a", "Research the claims")]},
        {"say": "Delegated."},
        {"say": "More.", "tool_calls": [_task("call-b", "Check the figures")]},
        {"say": "Both done."},
    ])
    await harness.run("Analyse the paper.", run_id="r1")
    compacted = await _compact_all(harness, "Summary one.")
    await harness.run("Check more.", run_id="r2")
    data = next(m for m in harness.log.requests[-1] if m.id == DATA_ID)
    assert "task call-a" in str(data.content)
    assert "task call-b" not in str(data.content)  # its call and result are in the tail, verbatim
    tail = harness.log.requests[-1][2:]
    assert any(isinstance(m, AIMessage) and m.tool_calls and m.tool_calls[0]["id"] == "call-b" for m in tail)
    assert all(m.id != compacted[0].id for m in tail)


class CompactAfterResults(AgentMiddleware):
    """Stands in for Summarization: once the tool results are in, compacts keeping ``keep``."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep

    async def abefore_model(self, state: dict[str, Any], runtime: Any) -> dict[str, Any] | None:
        messages = state["messages"]
        if state.get("compaction") or not isinstance(messages[-1], ToolMessage):
            return None
        cut = choose_cut(messages, self.keep)
        assert cut is not None
        return {"compaction": new_compaction(messages, cut, "Three researchers were sent.", None, model=None, at="t")}


async def test_replay_three_parallel_results_compacted_keeping_four(tmp_path: Path) -> None:
    """DeerFlow #4039: system, user, an assistant with three parallel calls, three results,
    compaction keeping 4. Its fix kept exactly the tool tail (an assistant-first history, HTTP
    400), then sent a second system message. Here: one system message, the agent's own
    instructions first, the summary before the first assistant message, the batch whole."""
    chain = build_agent_chain("lead", Limits(), strict_grammar=True).for_agent()
    calls = [_task(f"call-{i}", f"Research part {i}") for i in range(3)]
    harness = GuardHarness(
        script({"say": "Delegating.", "tool_calls": calls}, {"say": "Merged.", "expect": {"contains": "Three researchers"}}),
        [*chain, CompactAfterResults(keep=4)], tmp_path / "ws", tools=[_task_tool()],
    )
    out = await harness.run("Research the three parts.")
    request = harness.log.requests[-1]
    assert [m.type for m in request] == ["system", "human", "human", "ai", "tool", "tool", "tool"]
    assert str(request[0].content).startswith("You are a test agent.\n\n" + RULES[:40])
    assert request[1].id == DATA_ID and "Three researchers were sent." in str(request[1].content)
    assert "Research the three parts." in str(request[2].content)  # the latest request, pinned by id
    assert [m.tool_call_id for m in request[4:]] == ["call-0", "call-1", "call-2"]
    # The calls are in the tail, so the data message does not repeat them; the ledger has them.
    assert "task call-" not in str(request[1].content)
    assert [e["status"] for e in (await _durable(harness))["delegations"]] == ["completed"] * 3
    assert len(out.messages) == 6  # the thread keeps everything


def test_the_cut_is_found_by_id_when_an_outer_guard_inserted_messages() -> None:
    human = HumanMessage("go", id="h1")
    ai = AIMessage("", tool_calls=[{"name": "ls", "args": {}, "id": "c1"}], id="a1")
    answer = AIMessage("Listed.", id="a2")
    later = HumanMessage("next", id="h2")
    state = [human, ai, answer, later]
    durable = {"compaction": {"summary": "S", "compacted": 3, "through_id": "a2", "generation": 0},
               "delegations": [], "skills": [], "original_request": None}
    synthetic = ToolMessage("interrupted", tool_call_id="c1", id="syn")  # DanglingToolCall's repair
    request = [human, ai, synthetic, answer, later]
    out = projected(request, state, durable)
    assert out is not None and [m.id for m in out] == [RULES_ID, DATA_ID, "h2"]
    # A note an outer guard appended stays last (and is never taken for the user's request).
    note = hint_message("LoopDetection", ["You are repeating yourself."])
    out = projected([*request, note], state, durable)
    assert out is not None and [m.id for m in out[:-1]] == [RULES_ID, DATA_ID, "h2"] and out[-1] is note
    assert projected(request, state, {**durable, "compaction": None}) is None
    # A cut that no longer fits the thread (an edit removed the message) projects nothing.
    assert projected(request, [human, later], durable) is None


@pytest.mark.parametrize("mode", ["full", "delta"])
async def test_durable_channels_round_trip_identically_in_full_and_delta_mode(tmp_path: Path, mode: str) -> None:
    full, _ = await _compacted_thread(tmp_path / "full")
    other, _ = await _compacted_thread(
        tmp_path / mode, state_schema=agent_state_schema(mode), saver=InMemorySaver(),  # type: ignore[arg-type]
    )
    stored_as = {name: type(other.graph.channels[name]).__name__ for name in ("messages", "delegations", "skills")}
    assert set(stored_as.values()) == ({"DeltaChannel"} if mode == "delta" else {"BinaryOperatorAggregate"})
    assert [str(m.content) for m in other.log.requests[-1]] == [str(m.content) for m in full.log.requests[-1]]

    def comparable(values: dict[str, Any]) -> dict[str, Any]:
        ledger = [{k: v for k, v in e.items() if k not in ("created_at", "message_id")} for e in values["delegations"]]
        skills = [{k: v for k, v in e.items() if k != "message_id"} for e in values["skills"]]
        compaction = {k: v for k, v in (values["compaction"] or {}).items() if k != "through_id"}
        return {"delegations": ledger, "skills": skills, "compaction": compaction,
                "original_request": (values["original_request"] or {}).get("text")}

    assert comparable(await _durable(other)) == comparable(await _durable(full))
    # Read back through a fresh graph of the same schema over the same checkpoints.
    fresh = _harness(tmp_path / "fresh", [], state_schema=other.state_schema, saver=other.saver)
    assert await _durable(fresh) == await _durable(other)
