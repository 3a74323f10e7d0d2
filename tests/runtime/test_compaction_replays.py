"""Compaction replays through the whole runtime: the default lead chain with ``limits.summarization``
on, the strict scripted model (a request a strict provider would refuse fails the run), a real
store, journal and checkpointer.

* DeerFlow's subagent that sent an assistant-first history after compaction kept exactly its tool
  tail (user, an assistant with three parallel calls, three results; compaction keeping 4), then a
  duplicate system message after the fix: here the request after compaction is valid, the summary
  comes before the first assistant message, the agent's own instructions first — and a keep size
  landing inside the tool batch never sends an orphan tool result.
* A 160-turn run, compacting 38 times, keeps every request under a bound while the thread and the
  journal hold all of it.
* After compaction the delegation ledger, the loaded skills and the original request are still in
  front of the model (the script's ``expect:`` checks each), in ``full`` and ``delta`` checkpoint
  mode alike, and both modes end in the same state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from runtime_support import (
    LIGHT_MATRIX,
    Keel,
    backend_matrix,
    call,
    finished,
    journal,
    lead_requests,
    new_thread_id,
    start,
    thread_state,
    turn,
    workspace,
)

from agentkeel.harness.durable import durable_values
from agentkeel.harness.projection import DATA_ID
from agentkeel.harness.token_estimate import messages_tokens
from agentkeel.runtime.checkpoints import mode as mode_module
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)

SUMMARY_CALLER = "middleware:summarization"
INSTRUCTIONS = "You are the research lead. Work in /workspace and keep every note you write."
LIFTED = 1_000_000


def limits(trigger: dict[str, int], keep: int, turns: int = 50) -> dict[str, Any]:
    """Summarization on; the guards a long repetitive workload would (rightly) trip, lifted."""
    return {
        "summarization": {"enabled": True, **trigger, "keep_messages": keep},
        "turn_limit": {"max_turns": turns + 10},
        "loop_detection": {"tool_freq_warn": LIFTED, "tool_freq_hard_limit": LIFTED},
        "token_budget": {"max_tokens": 100_000_000},
        # a turn is up to five super-steps (two before_model hooks, the model, the tools)
        "recursion_limit": 5 * turns + 20, "max_recursion_limit": max(1000, 5 * turns + 20),
    }


def assistant() -> list[dict[str, Any]]:
    return [{"assistant_id": "lead", "system_prompt": INSTRUCTIONS}]


def orphan_results(messages: list[BaseMessage]) -> list[str]:
    """Tool results with no assistant call earlier in the request."""
    called: set[str] = set()
    orphans = []
    for message in messages:
        if isinstance(message, AIMessage):
            called |= {str(c["id"]) for c in message.tool_calls}
        elif isinstance(message, ToolMessage) and message.tool_call_id not in called:
            orphans.append(message.tool_call_id)
    return orphans


def isolated(keel: Keel, mode: str, root: Path) -> dict[str, Any]:
    """Config keys for a runtime of its own under ``root`` in checkpoint ``mode`` (two runtimes,
    one per mode, in one test)."""
    database = keel.backend.database_url
    if database.startswith("sqlite:"):
        database = f"sqlite:///{root / 'keel.db'}"
    return {"checkpoint_mode": mode, "data_dir": str(root / "data"), "database": database}


def comparable(values: dict[str, Any], run_ids: list[str]) -> dict[str, Any]:
    """A thread's final messages and durable channels without what differs between two runs of
    the same scripts (run ids, generated message ids, times)."""
    durable = durable_values(values)
    compaction = durable["compaction"] or {}
    through = next((i for i, m in enumerate(values["messages"]) if m.id == compaction.get("through_id")), None)
    state = {
        "messages": [(m.type, m.content, getattr(m, "tool_calls", None), getattr(m, "tool_call_id", None))
                     for m in values["messages"]],
        "delegations": [{k: v for k, v in e.items() if k != "created_at"} for e in durable["delegations"]],
        "skills": [{k: v for k, v in s.items() if k != "message_id"} for s in durable["skills"]],
        "original_request": (durable["original_request"] or {}).get("text"),
        "compaction": {**{k: compaction.get(k) for k in ("summary", "compacted", "generation")}, "through": through},
    }
    text = json.dumps(state, default=str, sort_keys=True)
    for run_id in run_ids:  # a scripted session's ids carry the run id's first eight characters
        text = text.replace(run_id, "RUN").replace(run_id[:8], "RUN")
    return dict(json.loads(text))


# -- the #4039 shape ---------------------------------------------------------------------------

REQUEST_4039 = "Research the energy markets of three regions and compare them. " * 8  # > 100 tokens
SUMMARY_4039 = "SUMMARY-4039: three regions were listed; their notes are in /workspace."


@pytest.mark.parametrize("keep", [4, 3, 2, 1])
async def test_4039_compaction_keeping_the_tool_batch_sends_a_valid_request(
    keel: Keel, sent: list[tuple[str, list[BaseMessage]]], keep: int
) -> None:
    # user, assistant with three parallel calls, three results: then compaction keeping `keep`
    # (4: exactly the batch; 3, 2, 1: inside it). The token trigger fires once there are 5 messages.
    lead = [
        turn("Three regions at once.", call("ls", "c-eu", path="/workspace"),
             call("ls", "c-us", path="/workspace/outputs"), call("ls", "c-asia", path="/workspace/uploads")),
        turn("Compared: all three regions done.", expect={"contains": "SUMMARY-4039"}),
    ]
    config = keel.config({"m": {"lead": lead, "summarization": [turn(SUMMARY_4039)]}},
                         limits=limits({"trigger_tokens": 100}, keep), assistants=assistant())
    async with keel.open(config) as rt:
        thread = new_thread_id("c4039")
        record = await finished(rt, (await start(rt, thread, REQUEST_4039)).run_id)
        events = await journal(rt, record.run_id)
        state = await thread_state(rt, thread)
    assert record.status is RunStatus.success, record.error

    first, second = lead_requests(sent)
    assert len(first) == 2  # the system prompt and the request: nothing to compact yet
    systems = [i for i, m in enumerate(second) if isinstance(m, SystemMessage)]
    assert systems == [0], "exactly one system message, first"
    assert str(second[0].content).startswith(INSTRUCTIONS), "the agent's own instructions first"
    first_ai = next(i for i, m in enumerate(second) if isinstance(m, AIMessage))
    assert any(SUMMARY_4039 in m.text for m in second[1:first_ai]), "the summary before the first assistant"
    assert isinstance(second[1], HumanMessage), "the history starts with a user message"
    assert orphan_results(second) == []
    assert [m.tool_call_id for m in second[first_ai + 1:] if isinstance(m, ToolMessage)] == ["c-eu", "c-us", "c-asia"]
    assert REQUEST_4039.strip() in "\n".join(m.text for m in second)  # the user's request, kept by id

    # The thread keeps every message; the summary call is the run's, journaled as its own caller.
    assert [m.type for m in state.values["messages"]] == ["human", "ai", "tool", "tool", "tool", "ai"]
    assert state.values["compaction"]["summary"] == SUMMARY_4039
    assert state.values["compaction"]["compacted"] == 1  # the batch stayed whole in the kept tail
    calls = [e for e in events if e.kind == "model.call"]
    assert [e.caller for e in calls] == ["lead", SUMMARY_CALLER, "lead"]


# -- a 160-turn run ------------------------------------------------------------------------------

# More compactions (38) than 300 turns at a trigger of 40 keeping 20 had (28), a thread that still
# ends over ten times the request bound, in about half the turns: the cost is the turns, each
# played through the whole runtime twice (full and delta mode).
TURNS = 160
TRIGGER, KEEP = 16, 8


def note_turns(turns: int) -> list[dict[str, Any]]:
    """``turns`` turns that each write a new note (``{turn}``-templated path and content)."""
    return [turn("Step {turn}: writing a note.",
                 call("write_file", path="/workspace/notes/{turn}.md",
                      content="Note {turn}: the figures of this step hold and the next source agrees.\n"),
                 repeat=turns)]


SUMMARIES = [turn("Summary {turn}: the agent writes one note per step into /workspace/notes; all so far "
                  "were written and confirmed.", repeat="forever")]


async def long_run(keel: Keel, sent: list[tuple[str, list[BaseMessage]]], mode: str, root: Path) -> dict[str, Any]:
    """The long run in checkpoint ``mode``, checked; its final state (:func:`comparable`)."""
    lead = [*note_turns(TURNS), turn(f"Done: {TURNS} notes written.")]
    config = keel.config({"m": {"lead": lead, "summarization": SUMMARIES}},
                         limits=limits({"trigger_messages": TRIGGER}, KEEP, TURNS), **isolated(keel, mode, root))
    async with keel.open(config) as rt:
        thread = new_thread_id("long")
        record = await finished(rt, (await start(rt, thread, "Write one note per step.")).run_id, timeout=300)
        events = await journal(rt, record.run_id)
        state = await thread_state(rt, thread)
    assert record.status is RunStatus.success, record.error
    assert record.stop_reason is None, record.stop_reasons

    # The thread holds every turn: the request, 160 calls with their results, the answer.
    messages = state.values["messages"]
    assert len(messages) == 2 * TURNS + 2
    assert len({m.id for m in messages}) == len(messages)
    assert sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls) == TURNS
    assert len(list((workspace(config, thread) / "notes").iterdir())) == TURNS

    # The journal holds every model call: the lead's 161 and the summary calls, as their own caller.
    calls = [e for e in events if e.kind == "model.call"]
    lead_calls = [e for e in calls if e.caller == "lead"]
    summary_calls = [e for e in calls if e.caller == SUMMARY_CALLER]
    assert len(lead_calls) == TURNS + 1
    assert len(summary_calls) >= (2 * TURNS - TRIGGER) // (TRIGGER - KEEP)
    assert len(calls) == len(lead_calls) + len(summary_calls)

    # Every request the lead was sent stays under a bound: no more than the trigger's messages
    # (plus the system prompt), and tokens that stop growing once compaction starts (the bound
    # leaves room for three-digit turn numbers) — against a thread that ends far larger.
    requests = lead_requests(sent)
    sent.clear()
    assert len(requests) == TURNS + 1
    assert max(len(r) for r in requests) <= TRIGGER + 1
    assert all(orphan_results(r) == [] for r in requests)
    tokens = [e.data["input_tokens"] for e in lead_calls]  # the scripted model's count of what it received
    bound = 1.25 * max(tokens[: TURNS // 5])
    assert max(tokens) <= bound, (bound, max(tokens))
    assert messages_tokens(messages) > 10 * bound
    # A summary call is bounded too: the previous summary and the newly compacted messages only.
    summary_tokens = [e.data["input_tokens"] for e in summary_calls]
    assert max(summary_tokens) <= 1.5 * max(summary_tokens[:3]), summary_tokens
    return {**comparable(state.values, [record.run_id]), "requests": [len(r) for r in requests], "tokens": tokens}


async def test_a_160_turn_run_keeps_every_request_under_a_bound_and_the_thread_whole_in_both_modes(
    keel: Keel, sent: list[tuple[str, list[BaseMessage]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = await long_run(keel, sent, "full", tmp_path / "full")
    monkeypatch.setattr(mode_module, "_frozen", None)  # a second runtime in this process, in the other mode
    delta = await long_run(keel, sent, "delta", tmp_path / "delta")
    assert delta == full  # the same messages, durable channels and requests


# -- the durable context survives compaction (and delta mode changes nothing) ---------------------

SKILL = ("---\nname: report-style\ndescription: How energy reports are written here.\n---\n"
         "Every figure carries its source and its date (SKILL-BODY-MARKER).\n")
ORIGINAL = "Compile the EU energy report (ORIGINAL-REQUEST-MARKER)."
TASK = "Research EU gas storage levels (LEDGER-MARKER)"


CHILD = [turn("Research done: storage is at 90%.")]
"""The general-purpose subagent the first run delegates to: it answers at once."""


FIRST_RUN = [
    turn("Delegating the research.", call("task", "c-task", description=TASK, prompt="Find the storage levels.", subagent_type="general-purpose")),
    turn("Reading the house style.", call("read_file", "c-skill", path="/skills/report-style/SKILL.md")),
    *note_turns(10),
    turn("Part one done."),
]
SECOND_RUN = [
    *note_turns(30),
    # Long after compaction took both runs' first messages out of the kept tail:
    turn("Checking the ledger.", call("ls", path="/workspace"), expect={"contains": "LEDGER-MARKER"}),
    turn("Checking the style.", call("ls", path="/workspace/notes"), expect={"contains": "SKILL-BODY-MARKER"}),
    turn("Charts added to the report.", expect={"contains": "ORIGINAL-REQUEST-MARKER"}),
]


async def durable_run(keel: Keel, sent: list[tuple[str, list[BaseMessage]]], mode: str, root: Path) -> dict[str, Any]:
    """Two runs on one thread (the second asks a follow-up); the final state, comparable across
    runs (ids and times left out)."""
    skill = root / "skills" / "report-style" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(SKILL)
    config = keel.config(
        {"first": {"lead": FIRST_RUN, "summarization": SUMMARIES, "general-purpose": CHILD},
         "second": {"lead": SECOND_RUN, "summarization": SUMMARIES}},
        limits=limits({"trigger_messages": 16}, 6), skills_dir=str(root / "skills"), **isolated(keel, mode, root),
    )
    thread = new_thread_id("durable")
    async with keel.open(config) as rt:
        one = await finished(rt, (await start(rt, thread, ORIGINAL, model_name="first")).run_id, timeout=60)
        assert one.status is RunStatus.success, one.error
        two = await finished(rt, (await start(rt, thread, "Now add charts.", model_name="second")).run_id, timeout=60)
        assert two.status is RunStatus.success, two.error
        values = (await thread_state(rt, thread)).values

    # The three facts reached the model from the durable context, not from the kept tail.
    last = lead_requests(sent)[-3:]
    for request, marker in zip(last, ("LEDGER-MARKER", "SKILL-BODY-MARKER", "ORIGINAL-REQUEST-MARKER"), strict=True):
        holders = [m.id for m in request if marker in m.text]
        assert holders == [DATA_ID], (marker, holders)
    assert all(orphan_results(r) == [] for r in lead_requests(sent))
    sent.clear()

    durable = durable_values(values)
    assert [(e["id"], e["status"]) for e in durable["delegations"]] == [("c-task", "completed")]
    assert [s["name"] for s in durable["skills"]] == ["report-style"]
    assert durable["original_request"]["text"] == ORIGINAL
    assert durable["compaction"]["compacted"] > 0
    return comparable(values, [one.run_id, two.run_id])


async def test_ledger_skills_and_original_request_survive_compaction_in_full_and_delta_mode(
    keel: Keel, sent: list[tuple[str, list[BaseMessage]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = await durable_run(keel, sent, "full", tmp_path / "full")
    monkeypatch.setattr(mode_module, "_frozen", None)  # a second runtime in this process, in the other mode
    delta = await durable_run(keel, sent, "delta", tmp_path / "delta")
    assert delta == full
