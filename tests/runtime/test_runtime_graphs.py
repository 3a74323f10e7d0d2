"""User graphs under the control plane, and agent runs in delta checkpoint mode."""

from __future__ import annotations

import textwrap

from runtime_support import (
    LIGHT_MATRIX,
    Keel,
    accessor,
    backend_matrix,
    call,
    data_events,
    describe,
    journal,
    new_thread_id,
    run_to_end,
    stream_events,
    turn,
)

from agentkeel.config import KeelConfig
from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.checkpoints import MODE_METADATA_KEY
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)

USER_GRAPHS = textwrap.dedent(
    '''
    """Two user graphs: a compiled StateGraph and a factory taking the run's config."""
    from typing import TypedDict

    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph


    class State(TypedDict, total=False):
        topic: str
        steps: list[str]
        thread: str


    def plan(state: State) -> State:
        get_stream_writer()({"stage": "plan", "topic": state["topic"]})
        return {"steps": [*state.get("steps", []), "plan"]}


    def act(state: State) -> State:
        get_stream_writer()({"stage": "act", "done": len(state["steps"])})
        return {"steps": [*state["steps"], "act"]}


    def _builder() -> StateGraph:
        builder = StateGraph(State)
        builder.add_node("plan", plan)
        builder.add_node("act", act)
        builder.add_edge(START, "plan")
        builder.add_edge("plan", "act")
        builder.add_edge("act", END)
        return builder


    compiled = _builder().compile()


    def make_graph(config):
        """A factory: the graph it builds depends on the run's config."""
        thread = config["configurable"]["thread_id"]

        def stamp(state: State) -> State:
            get_stream_writer()({"stage": "stamp", "thread": thread})
            return {"thread": thread}

        builder = _builder()
        builder.add_node("stamp", stamp)
        builder.add_edge("act", "stamp")
        builder.add_edge("stamp", END)
        return builder.compile()
    '''
)


def _graph_config(keel: Keel) -> KeelConfig:
    (keel.tmp_path / "user_graphs.py").write_text(USER_GRAPHS)
    return keel.config(graphs={"compiled_graph": "./user_graphs.py:compiled", "factory_graph": "./user_graphs.py:make_graph"})


async def test_a_compiled_user_graph_runs_under_the_control_plane(keel: Keel) -> None:
    async with keel.open(_graph_config(keel)) as rt:
        thread = new_thread_id("graph")
        run = await run_to_end(rt, thread, {"topic": "lifecycles"}, assistant_id="compiled_graph",
                               stream_mode=["custom", "values"])
        assert run.status == RunStatus.success, run.error
        assert run.stop_reasons == [] and run.usage["total_tokens"] == 0
        assert run.kwargs["model_name"] is None

        items = await stream_events(rt, run.run_id)
        assert items[0].event == "metadata" and items[-1].kind is EventKind.end
        assert [e.data for e in data_events(items, "custom")] == [
            {"stage": "plan", "topic": "lifecycles"}, {"stage": "act", "done": 1},
        ]
        assert data_events(items, "values")[-1].data == {"topic": "lifecycles", "steps": ["plan", "act"]}
        # The custom events come in causal order with the state they belong to.
        order = [(i.event, i.data.get("stage")) for i in data_events(items) if i.event in ("custom", "values")]
        assert order.index(("custom", "plan")) < order.index(("custom", "act"))

        kinds = [e.kind for e in await journal(rt, run.run_id)]
        assert kinds[0] == "run.start" and kinds[-1] == "run.end"
        assert "model.call" not in kinds
        # Checkpointed on the thread like any run.
        head = await rt.checkpointer.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        assert head is not None and head.checkpoint["channel_values"]["steps"] == ["plan", "act"]
        assert dict(head.metadata)[MODE_METADATA_KEY] == "full"


async def test_a_graph_factory_is_called_with_the_run_config(keel: Keel) -> None:
    async with keel.open(_graph_config(keel)) as rt:
        threads = [new_thread_id("factory"), new_thread_id("factory")]
        runs = [
            await run_to_end(rt, thread, {"topic": "x"}, assistant_id="factory_graph", stream_mode=["custom", "values"])
            for thread in threads
        ]
        for thread, run in zip(threads, runs, strict=True):
            assert run.status == RunStatus.success, run.error
            items = await stream_events(rt, run.run_id)
            assert items[-1].kind is EventKind.end
            stages = [e.data for e in data_events(items, "custom")]
            assert stages[-1] == {"stage": "stamp", "thread": thread}  # built for this run's thread
            assert data_events(items, "values")[-1].data == {"topic": "x", "steps": ["plan", "act"], "thread": thread}
            kinds = [e.kind for e in await journal(rt, run.run_id)]
            assert kinds[0] == "run.start" and kinds[-1] == "run.end"


async def test_delta_mode_runs_keep_the_whole_history(keel: Keel) -> None:
    config = keel.config(
        {
            "first": [turn("Noting it.", call("write_file", "call_n1", path="/workspace/n.md", content="1\n")),
                      turn("answer-one")],
            # Its first request must carry the previous run's answer: history is replayed from deltas.
            "second": [turn("Noting more.", call("write_file", "call_n2", path="/workspace/m.md", content="2\n"),
                            expect={"contains": "answer-one"}),
                       turn("answer-two")],
        },
        checkpoint_mode="delta",
    )
    thread = new_thread_id("delta")
    async with keel.open(config) as rt:
        one = await run_to_end(rt, thread, "question one", model_name="first")
        two = await run_to_end(rt, thread, "question two", model_name="second")
        assert (one.status, two.status) == (RunStatus.success, RunStatus.success), (one.error, two.error)

        state = await accessor(rt)
        assert state.mode == "delta" and "messages" in state.delta_channels
        snapshot = await state.aget(thread)
        assert snapshot is not None and snapshot.metadata is not None
        assert describe(snapshot.values["messages"]) == [
            ("human", "question one"), ("ai", "Noting it."), ("tool", "Wrote 2 bytes to /workspace/n.md"),
            ("ai", "answer-one"),
            ("human", "question two"), ("ai", "Noting more."), ("tool", "Wrote 2 bytes to /workspace/m.md"),
            ("ai", "answer-two"),
        ]
        assert dict(snapshot.metadata)[MODE_METADATA_KEY] == "delta"
        # Stored as deltas: the raw head checkpoint holds no message list, only the replay counters.
        raw = await state.araw_tuple(thread)
        assert raw is not None
        assert not isinstance(raw.checkpoint["channel_values"].get("messages"), list)
        assert "messages" in raw.metadata["counters_since_delta_snapshot"]
        ids = [m.id for m in snapshot.values["messages"]]
        assert len(set(ids)) == len(ids)


async def test_events_mode_streams_langchain_events_beside_the_requested_modes(keel: Keel) -> None:
    async with keel.open(_graph_config(keel)) as rt:
        thread = new_thread_id("events")
        run = await run_to_end(rt, thread, {"topic": "events"}, assistant_id="compiled_graph",
                               stream_mode=["events", "custom"])
        assert run.status == RunStatus.success, run.error
        items = await stream_events(rt, run.run_id)
        events = [e.data for e in data_events(items, "events")]
        kinds = [e["event"] for e in events]
        assert kinds[0] == "on_chain_start" and kinds[-1] == "on_chain_end"
        assert any(e["event"] == "on_chain_start" and e["name"] == "act" for e in events)
        # The requested graph mode still arrives once per chunk; unrequested modes do not.
        assert [e.data["stage"] for e in data_events(items, "custom")] == ["plan", "act"]
        assert data_events(items, "values") == []
