"""What the subagent tests share: the DeerFlow #3875 script, ``task`` calls, and readers of what
a run with children left (journal records, the lead's task results, the delegation ledger).

DeerFlow #3875: a lead delegated three one-sentence writing tasks; each subagent called the same
``write_file`` again and again, and nothing stopped it (about 4.4M tokens). Here each child replays
one ``write_file`` with ``repeat: forever``: only the guards can end it.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from runtime_support import call, turn

from agentkeel.harness.middleware.keys import SUBAGENT_RESULT
from agentkeel.runtime.stores.base import JournalEvent

GP = "general-purpose"
TOPICS = ("rivers", "hills", "seas")
LEAD_USAGE = ((1000, 60), (2000, 20))  # the delegating turn, then the answer
CHILD_USAGE = (500, 30)
LEAD_ANSWER = "The three sentences are written."


def task_call(description: str, prompt: str, subagent_type: str = GP, call_id: str | None = None) -> dict[str, Any]:
    return call("task", call_id, description=description, prompt=prompt, subagent_type=subagent_type)


def sentence_prompt(topic: str) -> str:
    return f"Write one sentence about {topic} to /workspace/outputs/{topic}.md"


def delegating_lead(topics: tuple[str, ...] = TOPICS, answer: str = LEAD_ANSWER) -> list[dict[str, Any]]:
    """The lead: one response with a ``task`` call per topic, then its answer."""
    calls = [task_call(f"Sentence about {t}", sentence_prompt(t)) for t in topics]
    return [turn("Delegating one sentence each.", *calls, usage=LEAD_USAGE[0]), turn(answer, usage=LEAD_USAGE[1])]


def runaway_child(content: str = "A sentence.\n", **extra: Any) -> list[dict[str, Any]]:
    """#3875's child: the same ``write_file`` forever (``content`` may carry ``{turn}`` to drift)."""
    write = call("write_file", path="/workspace/outputs/s{instance}.md", content=content)
    return [turn(None, write, usage=CHILD_USAGE, repeat="forever", **extra)]


def replay_script(content: str = "A sentence.\n") -> dict[str, list[dict[str, Any]]]:
    return {"lead": delegating_lead(), GP: runaway_child(content)}


# -- reading ----------------------------------------------------------------------------------


def of_kind(events: list[JournalEvent], kind: str) -> list[JournalEvent]:
    return [e for e in events if e.kind == kind]


def ends_by_task(events: list[JournalEvent]) -> dict[str, dict[str, Any]]:
    """``subagent.end`` data per task id (each task settles exactly once)."""
    ends = of_kind(events, "subagent.end")
    by_task = {e.data["task_id"]: e.data for e in ends}
    assert len(by_task) == len(ends), f"a task settled twice: {[e.data['task_id'] for e in ends]}"
    return by_task


def max_overlap(events: list[JournalEvent]) -> int:
    """The most children in flight at once, by journal order (start +1, end -1)."""
    level = peak = 0
    for event in sorted(events, key=lambda e: e.seq):
        if event.kind == "subagent.start":
            level += 1
            peak = max(peak, level)
        elif event.kind == "subagent.end":
            level -= 1
    return peak


def task_results(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    """The lead's ``task`` results by tool-call id."""
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage) and m.name == "task"}


def outcome_of(message: ToolMessage) -> dict[str, Any]:
    """The outcome carried as data on a ``task`` result."""
    artifact = message.artifact
    assert isinstance(artifact, dict) and SUBAGENT_RESULT in artifact, f"no outcome data on {message!r}"
    data = artifact[SUBAGENT_RESULT]
    assert isinstance(data, dict)
    return data


def last_answer(messages: list[BaseMessage]) -> str:
    last = messages[-1]
    assert isinstance(last, AIMessage) and not last.tool_calls, f"the run did not end on an answer: {last!r}"
    return str(last.content)


def tokens(usage: tuple[int, int]) -> int:
    return usage[0] + usage[1]


async def ledger(rt: Any, thread_id: str) -> dict[str, dict[str, Any]]:
    """The thread's delegation ledger by task id."""
    from runtime_support import thread_state

    from agentkeel.harness.durable import durable_values

    return {e["id"]: e for e in durable_values((await thread_state(rt, thread_id)).values)["delegations"]}


def child_tasks() -> list[Any]:
    """Unfinished asyncio tasks whose await chain runs through the subagent executor."""
    import asyncio

    def files(task: asyncio.Task[Any]) -> set[str]:
        seen: set[str] = set()
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                seen.add(frame.f_code.co_filename)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        return seen

    return [t for t in asyncio.all_tasks() if not t.done()
            and any(f.endswith("subagents/executor.py") for f in files(t))]
