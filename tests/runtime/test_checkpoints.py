"""Checkpoint access: frozen mode, state schemas, savers, and the StateAccessor in both modes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.pregel import Pregel
from runtime_support import checkpointer_on

from agentkeel.harness.state import (
    DeltaAgentState,
    FullAgentState,
    agent_state_schema,
    merge_message_batches,
    messages_state_schema,
)
from agentkeel.runtime.checkpoints import (
    MODE_METADATA_KEY,
    CheckpointMode,
    CheckpointModeError,
    StateAccessor,
    checkpoint_config,
    freeze_checkpoint_mode,
    frozen_checkpoint_mode,
    mark_checkpoint_mode,
    written_in_delta_mode,
)
from agentkeel.runtime.checkpoints import mode as mode_module

BACKENDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
async def saver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseCheckpointSaver]:
    url = {
        "memory": lambda: "memory://",
        "sqlite": lambda: f"sqlite:///{tmp_path / 'nested' / 'keel.db'}",
        "postgres": lambda: request.getfixturevalue("pg_url"),
    }[request.param]()
    async with checkpointer_on(url) as opened:
        yield opened


def _chat_graph(
    mode: CheckpointMode, saver: BaseCheckpointSaver | None, schema: type | None = None
) -> Pregel:
    """Each invocation: the input superstep writes the user message, ``reply`` answers it."""

    def reply(state: dict) -> dict:
        last = state["messages"][-1]
        return {"messages": [AIMessage(content=f"re: {last.content}", id=f"ai-{last.id}")]}

    builder = StateGraph(schema or messages_state_schema(mode))
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


async def _chat(
    graph: Pregel, mode: CheckpointMode, thread_id: str, turns: int, start: int = 0
) -> None:
    config = mark_checkpoint_mode(checkpoint_config(thread_id), mode)
    for i in range(start, start + turns):
        await graph.ainvoke({"messages": [HumanMessage(content=f"u{i}", id=f"u{i}")]}, config)


# -- frozen mode ------------------------------------------------------------------------------


def test_mode_freezes_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    assert frozen_checkpoint_mode() is None
    assert freeze_checkpoint_mode("delta") == "delta"
    assert freeze_checkpoint_mode("delta") == "delta"  # same mode again: fine
    with pytest.raises(CheckpointModeError, match="restart"):
        freeze_checkpoint_mode("full")
    assert frozen_checkpoint_mode() == "delta"
    with pytest.raises(ValueError):
        freeze_checkpoint_mode("partial")  # type: ignore[arg-type]


def test_accessor_needs_a_frozen_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    graph = _chat_graph("full", None)
    with pytest.raises(CheckpointModeError, match="not frozen"):
        StateAccessor(graph, None)  # type: ignore[arg-type]
    freeze_checkpoint_mode("full")
    assert StateAccessor(graph, InMemorySaver()).mode == "full"


def test_mark_checkpoint_mode_copies() -> None:
    config = {"configurable": {"thread_id": "t"}, "metadata": {"run_id": "r"}}
    marked = mark_checkpoint_mode(config, "delta")  # type: ignore[arg-type]
    assert marked["metadata"] == {"run_id": "r", MODE_METADATA_KEY: "delta"}
    assert config["metadata"] == {"run_id": "r"}
    assert written_in_delta_mode(marked["metadata"])
    assert written_in_delta_mode({"counters_since_delta_snapshot": {"messages": [1, 1]}})
    assert not written_in_delta_mode(
        {MODE_METADATA_KEY: "full", "counters_since_delta_snapshot": {}}
    )
    assert not written_in_delta_mode(None)


# -- schemas ----------------------------------------------------------------------------------


def test_merge_message_batches_is_batching_invariant() -> None:
    writes = [
        [HumanMessage("a", id="1")],
        [AIMessage("b", id="2"), HumanMessage("c", id="3")],
        [AIMessage("b2", id="2")],  # replaces by id
        [RemoveMessage(id="1")],
        [HumanMessage("d", id="4")],
    ]
    whole = merge_message_batches([], writes)
    assert [m.content for m in whole] == ["b2", "c", "d"]
    for cut in range(len(writes) + 1):
        assert merge_message_batches(merge_message_batches([], writes[:cut]), writes[cut:]) == whole


def test_agent_state_schemas() -> None:
    assert agent_state_schema("full") is FullAgentState
    assert agent_state_schema("delta") is DeltaAgentState
    with pytest.raises(ValueError):
        agent_state_schema("other")  # type: ignore[arg-type]

    class Noting(AgentMiddleware):  # a middleware inheriting AgentState's plain messages channel
        state_schema = AgentState

    model = GenericFakeChatModel(messages=iter([AIMessage("hi")]))
    delta = create_agent(model, [], state_schema=agent_state_schema("delta"), middleware=[Noting()])
    full = create_agent(model, [], state_schema=agent_state_schema("full"))
    assert isinstance(delta.channels["messages"], DeltaChannel)
    assert delta.channels["messages"].reducer is merge_message_batches
    assert not isinstance(full.channels["messages"], DeltaChannel)
    # The durable lists are deltas too in delta mode; the small values are stored whole.
    assert isinstance(delta.channels["delegations"], DeltaChannel)
    assert isinstance(delta.channels["skills"], DeltaChannel)
    assert not isinstance(delta.channels["compaction"], DeltaChannel)
    assert not any(isinstance(full.channels[k], DeltaChannel) for k in ("delegations", "skills", "compaction"))
    assert not isinstance(_chat_graph("full", None).channels["messages"], DeltaChannel)


# -- savers -----------------------------------------------------------------------------------


async def test_each_saver_round_trips(saver: BaseCheckpointSaver) -> None:
    graph = _chat_graph("full", saver)
    thread = f"t-{uuid.uuid4().hex}"
    await _chat(graph, "full", thread, 2)
    head = await saver.aget_tuple(checkpoint_config(thread))
    assert head is not None and head.metadata[MODE_METADATA_KEY] == "full"
    state = await graph.aget_state(checkpoint_config(thread))
    assert [m.content for m in state.values["messages"]] == ["u0", "re: u0", "u1", "re: u1"]


async def test_sqlite_saver_uses_wal_and_creates_parent(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "keel.db"
    async with (
        checkpointer_on(f"sqlite:///{path}") as opened,
        opened.conn.execute("PRAGMA journal_mode") as cur,  # type: ignore[attr-defined]
    ):
        assert (await cur.fetchone())[0] == "wal"
    assert path.exists()


# -- accessor ---------------------------------------------------------------------------------


async def test_delta_and_full_materialize_identical_state(saver: BaseCheckpointSaver) -> None:
    states = {}
    for mode in ("full", "delta"):
        graph = _chat_graph(mode, saver)
        thread = f"{mode}-{uuid.uuid4().hex}"
        await _chat(graph, mode, thread, 3)
        accessor = StateAccessor(graph, saver, mode=mode)
        head = await accessor.aget(thread)
        history = await accessor.ahistory(thread)
        raw = await saver.aget_tuple(checkpoint_config(thread))
        assert head is not None and raw is not None
        # In delta mode the raw head holds no message list; only the accessor rebuilds it.
        assert ("messages" in raw.checkpoint["channel_values"]) is (mode == "full")
        states[mode] = (
            head.values,
            [s.values for s in history],
            [s.metadata["step"] for s in history],
        )
        assert len(await accessor.ahistory(thread, limit=2)) == 2
        assert await accessor.ahistory(thread, limit=0) == []
        assert await accessor.aget(f"missing-{uuid.uuid4().hex}") is None
    assert states["full"] == states["delta"]
    assert [m.content for m in states["delta"][0]["messages"]][-2:] == ["u2", "re: u2"]


class _FrequentSnapshots(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(merge_message_batches, snapshot_frequency=3)]


async def test_delta_replay_across_snapshots(saver: BaseCheckpointSaver) -> None:
    """Reads start from the newest snapshot and replay the writes after it, batching included."""
    full_graph = _chat_graph("full", saver)
    frequent = _chat_graph("delta", saver, _FrequentSnapshots)
    thread = uuid.uuid4().hex
    await _chat(full_graph, "full", f"full-{thread}", 7)
    await _chat(frequent, "delta", f"delta-{thread}", 7)
    raw = [t async for t in saver.alist(checkpoint_config(f"delta-{thread}"))]
    assert any("messages" in t.checkpoint["channel_values"] for t in raw)  # snapshots were taken
    full = await StateAccessor(full_graph, saver, mode="full").ahistory(f"full-{thread}")
    delta = await StateAccessor(frequent, saver, mode="delta").ahistory(f"delta-{thread}")
    assert [s.values for s in delta] == [s.values for s in full]
    assert len(delta[0].values["messages"]) == 14


async def test_full_accessor_fails_closed_on_delta_thread(saver: BaseCheckpointSaver) -> None:
    thread = f"d-{uuid.uuid4().hex}"
    await _chat(_chat_graph("delta", saver), "delta", thread, 2)
    before = await saver.aget_tuple(checkpoint_config(thread))
    full = StateAccessor(_chat_graph("full", saver), saver, mode="full")
    with pytest.raises(CheckpointModeError, match="delta mode"):
        await full.aget(thread)
    with pytest.raises(CheckpointModeError):
        await full.ahistory(thread, limit=5)
    with pytest.raises(CheckpointModeError):
        await full.araw_tuple(thread)
    with pytest.raises(CheckpointModeError):
        await full.aupdate(thread, {"messages": [HumanMessage("x")]}, as_node="reply")
    with pytest.raises(CheckpointModeError):
        await full.amutate(thread, {"messages": [HumanMessage("x")]})
    after = await saver.aget_tuple(checkpoint_config(thread))
    assert before is not None and after is not None
    assert after.checkpoint["id"] == before.checkpoint["id"]  # the write gate ran before writing


async def test_full_mode_refuses_a_delta_graph() -> None:
    async with checkpointer_on("memory://") as saver:
        with pytest.raises(CheckpointModeError):
            StateAccessor(_chat_graph("delta", saver), saver, mode="full")


async def test_delta_accessor_migrates_a_full_thread(saver: BaseCheckpointSaver) -> None:
    thread = f"m-{uuid.uuid4().hex}"
    await _chat(_chat_graph("full", saver), "full", thread, 2)
    delta_graph = _chat_graph("delta", saver)
    accessor = StateAccessor(delta_graph, saver, mode="delta")
    migrated = await accessor.aget(thread)
    assert migrated is not None and len(migrated.values["messages"]) == 4
    await _chat(delta_graph, "delta", thread, 1, start=2)
    head = await accessor.aget(thread)
    assert head is not None and written_in_delta_mode(head.metadata)
    assert [m.content for m in head.values["messages"]] == [
        "u0",
        "re: u0",
        "u1",
        "re: u1",
        "u2",
        "re: u2",
    ]


async def test_updates_go_through_the_graph_and_carry_the_marker(
    saver: BaseCheckpointSaver,
) -> None:
    mode: CheckpointMode = "delta"
    graph = _chat_graph(mode, saver)
    thread = f"u-{uuid.uuid4().hex}"
    await _chat(graph, mode, thread, 1)
    accessor = StateAccessor(graph, saver, mode=mode)
    await accessor.amutate(
        thread, {"messages": [HumanMessage("note", id="n1")]}, metadata={"why": "test"}
    )
    head = await accessor.aget(thread)
    assert head is not None and head.next == ()
    assert [m.content for m in head.values["messages"]] == ["u0", "re: u0", "note"]
    assert head.metadata[MODE_METADATA_KEY] == "delta" and head.metadata["why"] == "test"
    config = await accessor.aupdate(
        thread, {"messages": [AIMessage("edited", id="n1")]}, as_node="reply"
    )
    edited = await accessor.aget(thread, config["configurable"]["checkpoint_id"])
    assert edited is not None and edited.values["messages"][-1].content == "edited"
    with pytest.raises(LookupError):
        await accessor.amutate(
            thread, {"messages": []}, checkpoint_id="1f000000-0000-6000-8000-000000000000"
        )


_message_ops = st.lists(
    st.lists(
        st.tuples(st.sampled_from(["human", "ai", "remove"]), st.sampled_from("abcde")), max_size=4
    ),
    max_size=6,
)


def _as_writes(ops: list[list[tuple[str, str]]]) -> list[list[Any]]:
    kinds = {"human": HumanMessage, "ai": AIMessage}
    return [
        [
            RemoveMessage(id=i) if k == "remove" else kinds[k](content=f"{k}{n}{j}", id=i)
            for j, (k, i) in enumerate(w)
        ]
        for n, w in enumerate(ops)
    ]


def _outcome(fn: Any) -> Any:
    try:
        return [(type(m).__name__, m.id, m.content) for m in fn()]
    except ValueError as exc:  # deleting an unknown id fails in both paths
        return str(exc)


@settings(max_examples=150, deadline=None)
@given(_message_ops, st.integers(min_value=0, max_value=6))
def test_merge_message_batches_equals_the_literal_fold(
    ops: list[list[tuple[str, str]]], cut: int
) -> None:
    writes = _as_writes(ops)

    def fold() -> list[Any]:
        merged: list[Any] = []
        for w in writes:
            merged = add_messages(merged, w)
        return merged

    expected = _outcome(fold)
    assert _outcome(lambda: merge_message_batches([], writes)) == expected
    assert (
        _outcome(
            lambda: merge_message_batches(merge_message_batches([], writes[:cut]), writes[cut:])
        )
        == expected
    )
