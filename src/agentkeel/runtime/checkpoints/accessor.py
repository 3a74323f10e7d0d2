"""The one sanctioned way the runtime reads and writes a thread's checkpointed state.

Why not the saver directly: in delta mode a raw checkpoint holds no message list, only a sentinel
(the list is rebuilt by replaying the writes since the last snapshot), so anything that reads
``checkpoint["channel_values"]`` sees an empty or stale history. Going through the graph's
``aget_state`` / ``aget_state_history`` / ``aupdate_state`` materializes channels the same way a
run does, in both modes. The accessor adds what LangGraph cannot know: the process's mode, a
fail-closed check that a thread was not written in the other mode (before any write, and on every
snapshot read), and the mode marker on every checkpoint it writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import StateSnapshot

from agentkeel.harness.state import CheckpointMode
from agentkeel.runtime.checkpoints.mode import (
    CheckpointModeError,
    ensure_readable,
    frozen_checkpoint_mode,
    mark_checkpoint_mode,
)

MUTATION_NODE = "state_mutation"


def checkpoint_config(thread_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    """Config addressing a thread's head (no id) or one of its checkpoints, in the root namespace.

    ``checkpoint_id`` is left out rather than set to None when absent: LangGraph treats the key's
    presence as "a historical checkpoint" and then skips the live view of finished tasks.
    """
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


class StateAccessor:
    """Reads and writes the checkpointed state of threads run by ``graph``.

    ``graph`` is the compiled graph whose schema the thread's checkpoints were written with (for an
    agent: ``create_agent(..., state_schema=agent_state_schema(mode))``); it is bound to
    ``checkpointer`` here if it was compiled without one. ``mode`` defaults to the process's
    frozen mode.
    """

    def __init__(
        self,
        graph: Pregel,
        checkpointer: BaseCheckpointSaver,
        *,
        mode: CheckpointMode | None = None,
    ) -> None:
        resolved = mode or frozen_checkpoint_mode()
        if resolved is None:
            raise CheckpointModeError(
                "checkpoint mode is not frozen; call freeze_checkpoint_mode() at start-up"
            )
        if resolved == "full" and isinstance(graph.channels.get("messages"), DeltaChannel):
            raise CheckpointModeError(
                "graph stores messages as a DeltaChannel but this process runs in full mode; "
                "compile it with agent_state_schema('full')"
            )
        self._mode: CheckpointMode = resolved
        self._saver = checkpointer
        if graph.checkpointer is not checkpointer:
            graph = graph.copy(update={"checkpointer": checkpointer})
        self._graph = graph
        self._mutation_graphs: dict[str, Pregel] = {}

    @property
    def mode(self) -> CheckpointMode:
        return self._mode

    @property
    def checkpointer(self) -> BaseCheckpointSaver:
        return self._saver

    @property
    def graph(self) -> Pregel:
        return self._graph

    @property
    def delta_channels(self) -> frozenset[str]:
        """Channels whose checkpoints hold deltas, not values (rebuilt by replay on read)."""
        return frozenset(k for k, v in self._graph.channels.items() if isinstance(v, DeltaChannel))

    async def araw_tuple(
        self, thread_id: str, checkpoint_id: str | None = None
    ) -> CheckpointTuple | None:
        """The raw checkpoint tuple (head, or ``checkpoint_id``), after the mode check.

        Raw means *not materialized*: use it for ids, metadata and pending writes, never for
        channel values. Also the pre-run gate: a run must not start on a thread this process
        cannot read.
        """
        tup = await self._saver.aget_tuple(checkpoint_config(thread_id, checkpoint_id))
        if tup is not None:
            ensure_readable(self._mode, thread_id, tup.metadata)
        return tup

    async def aget(self, thread_id: str, checkpoint_id: str | None = None) -> StateSnapshot | None:
        """Materialized state at the head (live: includes finished tasks' writes) or at an id.

        None when the thread (or that checkpoint) does not exist.
        """
        snapshot = await self._graph.aget_state(checkpoint_config(thread_id, checkpoint_id))
        if snapshot.created_at is None:  # LangGraph's placeholder for "no checkpoint"
            return None
        ensure_readable(self._mode, thread_id, snapshot.metadata)
        return snapshot

    async def ahistory(
        self, thread_id: str, limit: int | None = None, *, before: str | None = None
    ) -> list[StateSnapshot]:
        """Materialized snapshots, newest first; ``limit <= 0`` → ``[]``, None → all."""
        if limit is not None and limit <= 0:
            return []
        before_config = checkpoint_config(thread_id, before) if before is not None else None
        history: list[StateSnapshot] = []
        async for snapshot in self._graph.aget_state_history(
            checkpoint_config(thread_id), limit=limit, before=before_config
        ):
            ensure_readable(self._mode, thread_id, snapshot.metadata)
            history.append(snapshot)
        return history

    async def aupdate(
        self,
        thread_id: str,
        values: dict[str, Any] | None,
        *,
        as_node: str | None = None,
        checkpoint_id: str | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> RunnableConfig:
        """``aupdate_state`` on the graph itself: as if ``as_node`` returned ``values``.

        The node's edges run, so this can schedule work (LangGraph's usual semantics). For an edit
        that must leave nothing scheduled, use ``amutate``.
        """
        return await self._aupdate_with(
            self._graph, thread_id, values, as_node, checkpoint_id, metadata
        )

    async def amutate(
        self,
        thread_id: str,
        values: dict[str, Any],
        *,
        label: str = MUTATION_NODE,
        checkpoint_id: str | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> RunnableConfig:
        """A neutral edit: a new head forked from ``checkpoint_id`` (default: head) with ``values``.

        Applied by a one-node graph compiled with the same state schema (so every channel, delta
        or not, is read and written exactly as the agent graph would) whose node ``label`` leads
        straight to END: the edit schedules nothing. Used for rollback, branching, manual edits
        and compaction. Reducers apply; wrap a value in ``langgraph.types.Overwrite`` to replace.
        """
        return await self._aupdate_with(
            self.mutation_graph(label), thread_id, values, label, checkpoint_id, metadata
        )

    def mutation_graph(self, label: str = MUTATION_NODE) -> Pregel:
        """The one-node state-mutation graph for ``label`` (compiled once per label)."""
        if label not in self._mutation_graphs:
            schema = getattr(getattr(self._graph, "builder", None), "state_schema", None)
            if schema is None:
                raise TypeError(
                    "neutral state edits need the graph's state schema, but this graph was not "
                    "compiled from a StateGraph"
                )
            builder = StateGraph(schema)
            builder.add_node(label, _no_update)
            builder.add_edge(START, label)
            builder.add_edge(label, END)
            self._mutation_graphs[label] = builder.compile(checkpointer=self._saver)
        return self._mutation_graphs[label]

    async def _aupdate_with(
        self,
        graph: Pregel,
        thread_id: str,
        values: dict[str, Any] | None,
        as_node: str | None,
        checkpoint_id: str | None,
        metadata: Mapping[str, str | int | float | bool] | None,
    ) -> RunnableConfig:
        # The gate runs before writing: a full-mode write on a delta thread would be unreadable by
        # both modes afterwards.
        base = await self.araw_tuple(thread_id, checkpoint_id)
        if checkpoint_id is not None and base is None:
            # LangGraph would treat the missing base as a fresh thread and start a new history
            # holding only this update.
            raise LookupError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")
        config = checkpoint_config(thread_id, checkpoint_id)
        if metadata:
            config["metadata"] = dict(metadata)
        return await graph.aupdate_state(
            mark_checkpoint_mode(config, self._mode), values, as_node=as_node
        )


def _no_update(state: Any) -> dict[str, Any]:
    """Body of the mutation node; never executed (updates only run the node's writers)."""
    return {}


__all__ = ["MUTATION_NODE", "StateAccessor", "checkpoint_config"]
