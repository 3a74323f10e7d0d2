"""Rollback capture/restore on a real ``create_agent`` graph, both modes, every saver."""

from __future__ import annotations

import operator
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.channels import LastValue
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import NodeBuilder, Pregel
from langgraph.types import Command, interrupt
from runtime_support import checkpointer_on

from agentkeel.harness.state import agent_state_schema
from agentkeel.runtime.checkpoints import (
    RESTORED_FROM_KEY,
    CheckpointMode,
    CheckpointModeError,
    RollbackUnavailable,
    StateAccessor,
    capture_rollback_point,
    checkpoint_config,
    mark_checkpoint_mode,
    restore_rollback_point,
)

MODES: list[CheckpointMode] = ["full", "delta"]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def saver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseCheckpointSaver]:
    url = {
        "memory": lambda: "memory://",
        "sqlite": lambda: f"sqlite:///{tmp_path / 'keel.db'}",
        "postgres": lambda: request.getfixturevalue("pg_url"),
    }[request.param]()
    async with checkpointer_on(url) as opened:
        yield opened


class ScriptedChat(BaseChatModel):
    """Replies with the next scripted message, tool calls included (a copy, so runs never share)."""

    script: list[AIMessage]
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "checkpoint-test-script"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        reply = self.script[self.calls].model_copy()
        self.calls += 1
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def shout(text: str) -> str:
    """Return the text in capitals."""
    return text.upper()


@tool
def ask_human(question: str) -> str:
    """Ask the human and wait for the answer."""
    return str(interrupt(question))


def _calls(name: str, arg: str, call_id: str) -> AIMessage:
    key = "text" if name == "shout" else "question"
    return AIMessage(content="", tool_calls=[{"name": name, "args": {key: arg}, "id": call_id}])


def _agent(
    mode: CheckpointMode, saver: BaseCheckpointSaver, script: list[AIMessage]
) -> tuple[Pregel, StateAccessor]:
    model = ScriptedChat(script=script)
    graph = create_agent(
        model, [shout, ask_human], state_schema=agent_state_schema(mode), checkpointer=saver
    )
    return graph, StateAccessor(graph, saver, mode=mode)


async def _turn(graph: Pregel, mode: CheckpointMode, thread: str, payload: Any) -> None:
    if isinstance(payload, str):
        payload = {"messages": [{"role": "user", "content": payload}]}
    await graph.ainvoke(payload, mark_checkpoint_mode(checkpoint_config(thread), mode))


def _contents(values: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in values["messages"]]


@pytest.mark.parametrize("mode", MODES)
async def test_restore_returns_the_thread_to_its_pre_run_state(
    saver: BaseCheckpointSaver, mode: CheckpointMode
) -> None:
    script = [
        _calls("shout", "one", "c1"),
        AIMessage("done1"),
        _calls("shout", "two", "c2"),
        AIMessage("done2"),
        AIMessage("done3"),
    ]
    graph, accessor = _agent(mode, saver, script)
    thread = uuid.uuid4().hex
    await _turn(graph, mode, thread, "one")
    after_one = await accessor.aget(thread)
    assert after_one is not None and _contents(after_one.values) == ["one", "", "ONE", "done1"]

    point = await capture_rollback_point(accessor, thread)
    assert not point.empty_thread and point.values["messages"] == after_one.values["messages"]
    await _turn(graph, mode, thread, "two")
    assert len((await accessor.aget(thread)).values["messages"]) == 8  # type: ignore[union-attr]

    restored = await restore_rollback_point(accessor, point)
    head = await accessor.aget(thread)
    assert restored is not None and head is not None
    assert head.values["messages"] == after_one.values["messages"]
    assert head.next == ()
    assert head.config["configurable"]["checkpoint_id"] == restored["configurable"]["checkpoint_id"]
    assert head.metadata[RESTORED_FROM_KEY] == point.checkpoint_id
    parent = head.parent_config or {}
    assert parent["configurable"]["checkpoint_id"] == point.checkpoint_id
    # The abandoned run stays in history as an audit trail.
    assert any("two" in _contents(s.values) for s in await accessor.ahistory(thread))

    await _turn(graph, mode, thread, "three")
    final = await accessor.aget(thread)
    assert final is not None
    assert _contents(final.values) == ["one", "", "ONE", "done1", "three", "done3"]


@pytest.mark.parametrize("mode", MODES)
async def test_restore_keeps_a_pending_interrupt(
    saver: BaseCheckpointSaver, mode: CheckpointMode
) -> None:
    """Rolling back a resume puts the thread back to waiting, with its tool call still open."""
    script = [_calls("ask_human", "ok?", "c1"), AIMessage("rolled back"), AIMessage("answered")]
    graph, accessor = _agent(mode, saver, script)
    thread = uuid.uuid4().hex
    await _turn(graph, mode, thread, "start")
    waiting = await accessor.aget(thread)
    assert waiting is not None and waiting.next == ("tools",)

    point = await capture_rollback_point(accessor, thread)
    assert point.pending_writes and point.tasks
    await _turn(graph, mode, thread, Command(resume="first answer"))
    await restore_rollback_point(accessor, point)
    head = await accessor.aget(thread)
    assert head is not None and head.next == ("tools",)
    assert head.values["messages"] == waiting.values["messages"]
    assert [i.value for t in head.tasks for i in t.interrupts] == ["ok?"]

    await _turn(graph, mode, thread, Command(resume="second answer"))
    final = await accessor.aget(thread)
    assert final is not None and _contents(final.values) == [
        "start",
        "",
        "second answer",
        "answered",
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_restoring_an_empty_thread_point_deletes_the_thread(
    saver: BaseCheckpointSaver, mode: CheckpointMode
) -> None:
    graph, accessor = _agent(mode, saver, [AIMessage("hello")])
    thread = uuid.uuid4().hex
    point = await capture_rollback_point(accessor, thread)
    assert point.empty_thread
    await _turn(graph, mode, thread, "hi")
    assert await accessor.aget(thread) is not None
    assert await restore_rollback_point(accessor, point) is None
    assert await accessor.aget(thread) is None
    assert [t async for t in saver.alist(checkpoint_config(thread))] == []


async def test_no_point_means_no_rollback() -> None:
    async with checkpointer_on("memory://") as saver:
        graph, accessor = _agent("delta", saver, [AIMessage("hello")])
        thread = uuid.uuid4().hex
        await _turn(graph, "delta", thread, "hi")
        head = await accessor.araw_tuple(thread)
        with pytest.raises(RollbackUnavailable, match="refusing"):
            await restore_rollback_point(accessor, None)
        after = await accessor.araw_tuple(thread)
        assert head is not None and after is not None and after.config == head.config


async def test_failed_capture_raises_rollback_unavailable() -> None:
    class Broken(InMemorySaver):
        async def aget_tuple(self, config: Any) -> Any:
            raise OSError("disk on fire")

    saver = Broken()
    _, accessor = _agent("full", saver, [])
    with pytest.raises(RollbackUnavailable, match="disk on fire"):
        await capture_rollback_point(accessor, "t")


async def test_vanished_pre_run_checkpoint_is_refused() -> None:
    async with checkpointer_on("memory://") as saver:
        graph, accessor = _agent("delta", saver, [AIMessage("a"), AIMessage("b")])
        thread = uuid.uuid4().hex
        await _turn(graph, "delta", thread, "one")
        point = await capture_rollback_point(accessor, thread)
        await saver.adelete_thread(thread)
        await _turn(graph, "delta", thread, "two")
        head = await accessor.araw_tuple(thread)
        with pytest.raises(RollbackUnavailable, match="no longer exists"):
            await restore_rollback_point(accessor, point)
        after = await accessor.araw_tuple(thread)
        assert head is not None and after is not None and after.config == head.config


async def test_capture_on_a_thread_of_the_other_mode_is_a_mode_error() -> None:
    async with checkpointer_on("memory://") as saver:
        graph, _ = _agent("delta", saver, [AIMessage("a")])
        thread = uuid.uuid4().hex
        await _turn(graph, "delta", thread, "one")
        _, full = _agent("full", saver, [])
        with pytest.raises(CheckpointModeError):
            await capture_rollback_point(full, thread)


class _Counter(TypedDict):
    count: Annotated[int, operator.add]
    note: str


@pytest.mark.parametrize("mode", MODES)
async def test_user_graph_without_messages_rolls_back(mode: CheckpointMode) -> None:
    """The fork inherits every channel of the pre-run checkpoint, reducers included."""
    builder = StateGraph(_Counter)
    builder.add_node("inc", lambda s: {"count": 1, "note": f"after {s['count']}"})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    async with checkpointer_on("memory://") as saver:
        graph = builder.compile(checkpointer=saver)
        accessor = StateAccessor(graph, saver, mode=mode)
        await _turn(graph, mode, "t", {"count": 10})
        point = await capture_rollback_point(accessor, "t")
        await _turn(graph, mode, "t", {"count": 5})
        await restore_rollback_point(accessor, point)
        head = await accessor.aget("t")
        assert head is not None and head.values == {"count": 11, "note": "after 10"}


async def test_graph_without_state_schema_cannot_capture() -> None:
    async with checkpointer_on("memory://") as saver:
        node = NodeBuilder().subscribe_only("a").do(lambda x: x + "!").write_to("b")
        graph = Pregel(
            nodes={"n": node},
            channels={"a": LastValue(str), "b": LastValue(str)},
            input_channels=["a"],
            output_channels=["b"],
            checkpointer=saver,
        )
        await graph.ainvoke({"a": "x"}, checkpoint_config("t"))
        with pytest.raises(RollbackUnavailable, match="StateGraph"):
            await capture_rollback_point(StateAccessor(graph, saver, mode="full"), "t")
