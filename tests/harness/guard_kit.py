"""Running a real LangChain agent with a chosen middleware list on the scripted model (strict).

Every guard test drives the real ``create_agent`` loop: the scripted model answers from a script,
the built-in workspace tools run in a temporary workspace, and the run's stop reasons, journal
interventions and the exact requests the model received are returned for assertions.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agentkeel.harness.context import RunContext
from agentkeel.harness.middleware.base import KeelMiddleware
from agentkeel.harness.middleware.responses import is_hint, was_stripped
from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptSession
from agentkeel.harness.stop_reasons import StopReasonCollector
from agentkeel.harness.tools import build_tools


class ListJournal:
    """A journal sink that keeps records in a list (``kind``, ``data``, ``caller``, ``seq``).

    ``written_through`` lists the seqs ``write_through`` stored; with ``down`` set it raises, as the
    runtime's journal does when its store fails."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.written_through: list[int] = []
        self.down = False
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seq)

    def record(self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None, *, seq: int | None = None) -> int:
        seq = seq if seq is not None else self.next_seq()
        self.records.append({"kind": kind, "data": dict(data or {}), "caller": caller, "seq": seq})
        return seq

    async def write_through(self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None) -> int:
        if self.down:
            raise ConnectionError("journal store down")
        seq = self.record(kind, data, caller)
        self.written_through.append(seq)
        return seq

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


class MeterUsage:
    """A usage meter fed from the model callbacks, as the runtime's accumulator is."""

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0


class RequestLog(BaseCallbackHandler):
    """Records every request the model received (the messages exactly as sent) and feeds usage."""

    run_inline = True

    def __init__(self, usage: MeterUsage) -> None:
        self.requests: list[list[BaseMessage]] = []
        self._usage = usage

    def on_chat_model_start(self, serialized: Any, messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.requests.append(list(messages[0]))

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        message = getattr(response.generations[0][0], "message", None)
        usage = getattr(message, "usage_metadata", None) or {}
        self._usage.input_tokens += int(usage.get("input_tokens") or 0)
        self._usage.output_tokens += int(usage.get("output_tokens") or 0)


@dataclass
class Outcome:
    messages: list[BaseMessage]
    stop_reasons: list[dict[str, Any]]
    journal: Any  # GuardHarness.journal
    requests: list[list[BaseMessage]]
    interrupts: list[Any] = field(default_factory=list)

    @property
    def codes(self) -> list[str]:
        return [e["code"] for e in self.stop_reasons]


@dataclass
class GuardHarness:
    """One agent (``lead``) over one workspace and thread; call :meth:`run` once or several times."""

    script: dict[str, Any]
    middleware: list[Any]
    workspace: Path
    tools: list[Any] | None = None
    thread_id: str = "t1"
    strict_grammar: bool = True
    # A ListJournal, or the runtime's Journal where a test needs real durability.
    journal: Any = field(default_factory=ListJournal)
    callbacks: list[Any] = field(default_factory=list)
    attempt: int = 1
    recovered_calls: dict[str, str] = field(default_factory=dict)
    usage: MeterUsage = field(default_factory=MeterUsage)
    saver: InMemorySaver = field(default_factory=InMemorySaver)
    # "messages" as well makes LangChain stream every model call (as chat clients do).
    stream_modes: tuple[str, ...] = ("updates",)
    # The graph's state schema (``agent_state_schema(mode)``); None: LangChain's plus the middleware's.
    state_schema: Any = None

    def __post_init__(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.collector = StopReasonCollector(self.journal.next_seq)
        self.log = RequestLog(self.usage)
        for mw in self.middleware:
            if isinstance(mw, KeelMiddleware):
                mw.strict_grammar = self.strict_grammar
        script = Script.model_validate({"strict": True, **self.script})
        model = ScriptedChatModel(script=script, session=ScriptSession("k")).for_agent("lead")
        tools = self.tools if self.tools is not None else build_tools(bash_enabled=False)
        self.graph = create_agent(
            model, tools, middleware=self.middleware, system_prompt="You are a test agent.",
            context_schema=RunContext, checkpointer=self.saver, name="lead", state_schema=self.state_schema,
        )

    def context(self, run_id: str = "r1") -> RunContext:
        return RunContext(
            thread_id=self.thread_id, run_id=run_id, workspace_root=self.workspace,
            stop_reasons=self.collector, journal=self.journal, usage=self.usage,
            attempt=self.attempt, recovered_calls=dict(self.recovered_calls),
        )

    async def run(self, prompt: str | None = "Please do the task.", *, resume: Any = None, run_id: str = "r1") -> Outcome:
        """One run: a new prompt, an answer to an interrupt (``resume``), or with neither a
        continuation from the thread's last checkpoint (as a recovered attempt resumes)."""
        config = {
            "configurable": {"thread_id": self.thread_id},
            "callbacks": [self.log, *self.callbacks],
            "recursion_limit": 500,
        }
        graph_input: Any = (
            Command(resume=resume) if resume is not None
            else {"messages": [("user", prompt)]} if prompt is not None
            else None
        )
        interrupts: list[Any] = []
        async for mode, chunk in self.graph.astream(
            graph_input, config, context=self.context(run_id), stream_mode=list(self.stream_modes)
        ):
            if mode == "updates" and "__interrupt__" in chunk:
                interrupts.extend(chunk["__interrupt__"])
        state = await self.graph.aget_state(config)
        return Outcome(
            messages=list(state.values.get("messages", [])),
            stop_reasons=self.collector.entries,
            journal=self.journal,
            requests=self.log.requests,
            interrupts=interrupts,
        )


async def run_agent(script: dict[str, Any], middleware: list[Any], workspace: Path, **kwargs: Any) -> Outcome:
    """One run of a fresh :class:`GuardHarness`."""
    return await GuardHarness(script, middleware, workspace, **kwargs).run()


# -- helpers shared by the guard tests ------------------------------------------------------------


def script(*turns: dict[str, Any]) -> dict[str, Any]:
    """A script whose ``lead`` plays ``turns``."""
    return {"agents": {"lead": list(turns)}}


def counting_tool(name: str, counter: Counter[str]) -> BaseTool:
    """A tool that records each invocation under ``name`` and accepts any ``n``."""

    def run(n: int = 0) -> str:
        counter[name] += 1
        return f"{name} {n}"

    return tool(name, description=f"The {name} tool.")(run)


class KeepGoing(AgentMiddleware):
    """Stands in for whatever continues a run after a withheld response (a user, another turn):
    asks the model to go on, ``times`` times."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.left = times

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: dict[str, Any], runtime: Any) -> dict[str, Any] | None:
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and was_stripped(last) and self.left > 0:
            self.left -= 1
            return {"messages": [HumanMessage("Go on.")], "jump_to": "model"}
        return None


class RetryOnce(AgentMiddleware):
    """An outer stand-in for retry middleware: re-runs the whole inner chain once on an error."""

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        try:
            return await handler(request)
        except Exception:
            return await handler(request)


def hints(request: list[BaseMessage], name: str) -> list[str]:
    """The texts of the transient notes named ``name`` in one request."""
    return [str(m.content) for m in request if is_hint(m) and m.name == name]


def assert_provider_valid(outcome: Outcome) -> None:
    """Every AIMessage with tool calls is immediately followed by exactly its ToolMessages, and no
    hint ever reaches state."""
    for request in outcome.requests:
        for i, message in enumerate(request):
            if isinstance(message, AIMessage) and message.tool_calls:
                ids = {c["id"] for c in message.tool_calls}
                following = request[i + 1 : i + 1 + len(ids)]
                assert all(isinstance(m, ToolMessage) for m in following)
                assert {m.tool_call_id for m in following} == ids
    assert not any(is_hint(m) for m in outcome.messages)


def final_ai(outcome: Outcome) -> AIMessage:
    """The last assistant message in the final state."""
    return next(m for m in reversed(outcome.messages) if isinstance(m, AIMessage))
