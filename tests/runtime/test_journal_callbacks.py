"""JournalCallbackHandler inside real LangChain ``create_agent`` runs (async and sync)."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult, LLMResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool

from agentkeel.runtime.journal import Journal
from agentkeel.runtime.journal_callbacks import JournalCallbackHandler
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.stores.memory import MemoryJournalStore
from agentkeel.runtime.usage import UsageAccumulator


class TurnModel(BaseChatModel):
    """Replays prepared AIMessages, one per call; raises once they run out."""

    turns: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "turns"

    def bind_tools(self, tools: Any, **kwargs: Any) -> TurnModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if not self.turns:
            raise RuntimeError("provider unavailable")
        return ChatResult(generations=[ChatGeneration(message=self.turns.pop(0))])


Call = tuple[str, dict[str, Any], str]  # tool name, args, call id


def turn(
    content: str = "",
    calls: tuple[Call, ...] = (),
    tokens: tuple[int, int] = (0, 0),
    finish: str = "stop",
    meta_key: str = "model_name",
) -> AIMessage:
    return AIMessage(
        content=content,
        tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls],
        usage_metadata={"input_tokens": tokens[0], "output_tokens": tokens[1], "total_tokens": sum(tokens)},
        response_metadata={meta_key: "fake-1", "finish_reason": finish},
    )


@tool
def add(a: int, b: int) -> str:
    """Add two numbers."""
    time.sleep(0.02)
    return str(a + b)


@tool
def fetch(url: str) -> str:
    """Fetch a URL."""
    raise ToolException("401 unauthorized")


fetch.handle_tool_error = True


@tool
def explode(x: str) -> str:
    """Crash."""
    raise ValueError("boom")


def two_turns() -> list[AIMessage]:
    return [
        turn(
            calls=(("add", {"a": 1, "b": 2}, "call_1"), ("fetch", {"url": "u"}, "call_2")),
            tokens=(100, 10),
            finish="tool_calls",
        ),
        turn("the answer is 3", tokens=(150, 5), meta_key="model"),
    ]


Setup = tuple[MemoryJournalStore, Journal, UsageAccumulator, JournalCallbackHandler]


async def setup(flush_every: int = 32, store: MemoryJournalStore | None = None) -> Setup:
    store = store or MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1", flush_every=flush_every)
    usage = UsageAccumulator()
    return store, journal, usage, JournalCallbackHandler(journal, usage)


def of_kind(events: list[JournalEvent], kind: str) -> list[JournalEvent]:
    return [e for e in events if e.kind == kind]


def check_two_turn_run(events: list[JournalEvent], journal: Journal, usage: UsageAccumulator) -> None:
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    models = of_kind(events, "model.call")
    first = {"input_tokens": 100, "output_tokens": 10, "finish_reason": "tool_calls", "tool_calls": 2,
             "estimated": False}
    second = {"input_tokens": 150, "output_tokens": 5, "finish_reason": "stop", "tool_calls": 0,
              "estimated": False}
    assert [{k: v for k, v in m.data.items() if k != "output"} for m in models] == [
        {"model": "fake-1", "latency_ms": models[0].data["latency_ms"], **first},
        {"model": "fake-1", "latency_ms": models[1].data["latency_ms"], **second},
    ]
    # what the model answered, as ``keel replay --export`` plays it again
    assert models[0].data["output"]["tool_calls"] == [
        {"id": "call_1", "name": "add", "args": {"a": 1, "b": 2}}, {"id": "call_2", "name": "fetch", "args": {"url": "u"}}]
    assert models[1].data["output"]["tool_calls"] == [] and isinstance(models[1].data["output"]["text"], str)
    assert all(m.caller == "lead" and m.data["latency_ms"] >= 0 for m in models)
    tools = {e.data["call_id"]: e for e in of_kind(events, "tool.call")}
    assert set(tools) == {"call_1", "call_2"}
    assert tools["call_1"].data["name"] == "add" and tools["call_1"].data["status"] == "ok"
    assert tools["call_1"].data["result_size"] == 1 and tools["call_1"].data["duration_ms"] >= 15
    assert tools["call_2"].data["status"] == "error"
    assert tools["call_2"].data["result_size"] == len("401 unauthorized")
    assert tools["call_2"].data["result_sha256"] == hashlib.sha256(b"401 unauthorized").hexdigest()
    assert models[0].seq < tools["call_1"].seq < models[1].seq
    assert journal.seq_of_tool_call("call_1") == tools["call_1"].seq
    out = usage.as_dict()
    assert (out["input_tokens"], out["output_tokens"], out["total_tokens"]) == (250, 15, 265)
    assert out["by_caller"]["lead"]["calls"] == 2
    assert out["by_model"]["fake-1"]["calls"] == 2


async def test_async_agent_run_is_journaled() -> None:
    store, journal, usage, handler = await setup(flush_every=2)
    agent = create_agent(TurnModel(turns=two_turns()), [add, fetch])
    config: RunnableConfig = {"callbacks": [handler], "tags": ["lead"]}
    result = await agent.ainvoke({"messages": [HumanMessage("add 1 and 2")]}, config)
    assert result["messages"][-1].content == "the answer is 3"
    await journal.close()
    check_two_turn_run(await store.list("r1"), journal, usage)


async def test_sync_agent_run_in_a_thread_is_journaled() -> None:
    store, journal, usage, handler = await setup(flush_every=2)
    agent = create_agent(TurnModel(turns=two_turns()), [add, fetch])
    config: RunnableConfig = {"callbacks": [handler]}
    await asyncio.to_thread(agent.invoke, {"messages": [HumanMessage("add")]}, config)
    await journal.close()
    check_two_turn_run(await store.list("r1"), journal, usage)


async def test_nested_subagent_calls_count_as_subagent() -> None:
    sub_model = TurnModel(turns=[turn("found it", tokens=(1000, 50))])

    @tool
    def research(question: str, config: RunnableConfig) -> str:
        """Delegate to a research subagent."""
        # The subagent inherits the lead's callbacks (and its ``lead`` tag) and adds its own tag.
        child: RunnableConfig = {**config, "tags": ["subagent:research"]}
        return str(sub_model.invoke(question, child).content)

    store, journal, usage, handler = await setup()
    delegate = turn(calls=(("research", {"question": "q"}, "call_r"),), tokens=(100, 10))
    lead = TurnModel(turns=[delegate, turn("ok", tokens=(120, 3))])
    config: RunnableConfig = {"callbacks": [handler], "tags": ["lead"]}
    await create_agent(lead, [research]).ainvoke({"messages": [HumanMessage("go")]}, config)
    await journal.close()
    models = of_kind(await store.list("r1"), "model.call")
    assert [m.caller for m in models] == ["lead", "subagent:research", "lead"]
    out = usage.as_dict()
    assert out["by_caller"]["subagent"]["total_tokens"] == 1050
    assert out["by_caller"]["lead"]["total_tokens"] == 233
    assert out["by_agent"]["subagent:research"]["calls"] == 1


async def test_model_error_and_crashing_tool_are_recorded() -> None:
    store, journal, usage, handler = await setup()
    crash = turn(calls=(("explode", {"x": "1"}, "call_x"),), tokens=(10, 1))
    agent = create_agent(TurnModel(turns=[crash]), [explode])
    with pytest.raises(ValueError):
        await agent.ainvoke({"messages": [HumanMessage("x")]}, config={"callbacks": [handler]})
    failing = create_agent(TurnModel(turns=[]), [])
    with pytest.raises(RuntimeError):
        await failing.ainvoke({"messages": [HumanMessage("x")]}, config={"callbacks": [handler]})
    await journal.close()
    events = await store.list("r1")
    (crash,) = of_kind(events, "tool.call")
    assert crash.data["call_id"] == "call_x" and crash.data["status"] == "error"
    assert crash.data["error_type"] == "ValueError" and crash.data["name"] == "explode"
    (error,) = of_kind(events, "model.error")
    assert error.data["error_type"] == "RuntimeError" and error.data["message"] == "provider unavailable"
    assert error.data["model"] == "unknown" and error.data["latency_ms"] >= 0
    assert usage.as_dict()["by_caller"]["lead"]["calls"] == 1


async def test_run_survives_a_failing_store_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    class FlakyStore(MemoryJournalStore):
        failing = False

        async def append(self, events: list[JournalEvent]) -> None:
            if self.failing:
                raise ConnectionError("db down")
            await super().append(events)

    store = FlakyStore()
    store, journal, usage, handler = await setup(flush_every=1, store=store)
    store.failing = True
    agent = create_agent(TurnModel(turns=two_turns()), [add, fetch])
    result = await agent.ainvoke({"messages": [HumanMessage("add")]}, config={"callbacks": [handler]})
    assert result["messages"][-1].content == "the answer is 3"
    await asyncio.sleep(0)
    assert "events failed" in caplog.text
    assert await store.list("r1") == []
    store.failing = False
    await journal.close()
    events = await store.list("r1")
    assert [e.seq for e in events] == list(range(1, 5))
    check_two_turn_run(events, journal, usage)


async def test_handler_never_raises_into_the_graph(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenUsage(UsageAccumulator):
        def add(self, *args: Any, **kwargs: Any) -> bool:
            raise RuntimeError("accounting bug")

    store = MemoryJournalStore()
    journal = await Journal.open(store, "r1", "t1")
    handler = JournalCallbackHandler(journal, BrokenUsage())
    agent = create_agent(TurnModel(turns=two_turns()), [add, fetch])
    result = await agent.ainvoke({"messages": [HumanMessage("add")]}, config={"callbacks": [handler]})
    assert result["messages"][-1].content == "the answer is 3"
    assert "on_llm_end failed" in caplog.text
    # Odd payloads (no generations, no start seen) are journaled with what is known.
    handler.on_llm_end(LLMResult(generations=[]), run_id=uuid.uuid4())
    await journal.close()
    events = await store.list("r1")
    assert len(of_kind(events, "tool.call")) == 2
    models = of_kind(events, "model.call")
    assert len(models) == 3  # journaled before the (failing) accounting
    assert models[-1].data["model"] == "unknown" and models[-1].data["latency_ms"] is None
