"""Reading a thread's state for the API, and the JSON shapes of ``Thread`` and ``ThreadState``.

State is read through the graph the thread's checkpoints were written with (its channels decide
how values materialize, delta channels included) and checked with ``ensure_readable`` exactly as
``StateAccessor`` does. The accessor's own reads cover the root namespace only; the API also asks
for subgraph state (``subgraphs``, ``checkpoint_ns``) and filters history by metadata, so the reads
here pass those options to the same graph.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from langchain_core.runnables import RunnableConfig
from langgraph.types import PregelTask, StateSnapshot

from agentkeel.runtime.checkpoints import (
    CheckpointModeError,
    StateAccessor,
    checkpoint_config,
    ensure_readable,
)
from agentkeel.runtime.records import ThreadRecord
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.serialization import to_jsonable
from agentkeel.runtime.threads import graph_of_thread


def state_config(thread_id: str, checkpoint: dict[str, Any] | None = None) -> RunnableConfig:
    """Config addressing a checkpoint the way the API names one (``{checkpoint_id, checkpoint_ns,
    checkpoint_map}``, each optional)."""
    checkpoint = checkpoint or {}
    config = checkpoint_config(thread_id, checkpoint.get("checkpoint_id"))
    config["configurable"]["checkpoint_ns"] = checkpoint.get("checkpoint_ns") or ""
    if checkpoint.get("checkpoint_map"):
        config["configurable"]["checkpoint_map"] = checkpoint["checkpoint_map"]
    return config


async def thread_accessor(runtime: Runtime, thread: ThreadRecord) -> StateAccessor:
    return await runtime.accessor(await graph_of_thread(runtime, thread))


async def read_state(
    accessor: StateAccessor, thread_id: str, checkpoint: dict[str, Any] | None = None, subgraphs: bool = False
) -> StateSnapshot | None:
    """The materialized state at the head (or the given checkpoint); None if there is none."""
    try:
        snapshot = await accessor.graph.aget_state(state_config(thread_id, checkpoint), subgraphs=subgraphs)
        if snapshot.created_at is None:  # LangGraph's placeholder for "no checkpoint"
            return None
        ensure_readable(accessor.mode, thread_id, snapshot.metadata)
    except CheckpointModeError as exc:
        raise HTTPException(409, str(exc)) from None
    return snapshot


async def read_history(
    accessor: StateAccessor,
    thread_id: str,
    *,
    limit: int,
    before: str | None,
    metadata: dict[str, Any] | None,
    checkpoint: dict[str, Any] | None,
) -> list[StateSnapshot]:
    """Materialized checkpoints, newest first."""
    history: list[StateSnapshot] = []
    try:
        async for snapshot in accessor.graph.aget_state_history(
            state_config(thread_id, checkpoint),
            filter=metadata or None,
            before=checkpoint_config(thread_id, before) if before else None,
            limit=limit,
        ):
            ensure_readable(accessor.mode, thread_id, snapshot.metadata)
            history.append(snapshot)
    except CheckpointModeError as exc:
        raise HTTPException(409, str(exc)) from None
    return history


# -- JSON shapes ----------------------------------------------------------------------------------
def checkpoint_view(config: RunnableConfig | None) -> dict[str, Any] | None:
    if not config:
        return None
    c = config.get("configurable") or {}
    return {
        "thread_id": c.get("thread_id"),
        "checkpoint_ns": c.get("checkpoint_ns", ""),
        "checkpoint_id": c.get("checkpoint_id"),
        "checkpoint_map": c.get("checkpoint_map"),
    }


def _interrupts(interrupts: Any) -> list[dict[str, Any]]:
    return [{"id": i.id, "value": to_jsonable(i.value)} for i in interrupts]


def _task_view(task: PregelTask) -> dict[str, Any]:
    state = task.state
    nested = state if isinstance(state, StateSnapshot) else None
    return {
        "id": task.id,
        "name": task.name,
        "path": to_jsonable(task.path),
        "error": None if task.error is None else f"{type(task.error).__name__}: {task.error}",
        "interrupts": _interrupts(task.interrupts),
        "checkpoint": checkpoint_view(nested.config if nested else state),  # type: ignore[arg-type]
        "state": state_view(nested) if nested else None,
        "result": to_jsonable(task.result),
    }


def state_view(snapshot: StateSnapshot) -> dict[str, Any]:
    checkpoint = checkpoint_view(snapshot.config)
    parent = checkpoint_view(snapshot.parent_config)
    return {
        "values": to_jsonable(snapshot.values),
        "next": list(snapshot.next),
        "tasks": [_task_view(t) for t in snapshot.tasks],
        "metadata": to_jsonable(snapshot.metadata),
        "created_at": snapshot.created_at,
        "checkpoint": checkpoint,
        "parent_checkpoint": parent,
        "interrupts": _interrupts(snapshot.interrupts),
        "checkpoint_id": checkpoint["checkpoint_id"] if checkpoint else None,
        "parent_checkpoint_id": parent["checkpoint_id"] if parent else None,
    }


def empty_state_view(thread_id: str) -> dict[str, Any]:
    """The state of a thread that has no checkpoint yet (created, never run)."""
    return {
        "values": {},
        "next": [],
        "tasks": [],
        "metadata": None,
        "created_at": None,
        "checkpoint": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": None, "checkpoint_map": None},
        "parent_checkpoint": None,
        "interrupts": [],
        "checkpoint_id": None,
        "parent_checkpoint_id": None,
    }


def select_fields(view: dict[str, Any], select: list[str] | None) -> dict[str, Any]:
    """Keep only the selected fields; ``values.<key>`` keeps that one key of ``values``."""
    if not select:
        return view
    chosen = {name: view[name] for name in select if name in view}
    value_keys = [name.removeprefix("values.") for name in select if name.startswith("values.")]
    if value_keys and isinstance(view.get("values"), dict):
        chosen["values"] = {k: view["values"][k] for k in value_keys if k in view["values"]}
    return chosen


async def thread_view(runtime: Runtime, thread: ThreadRecord, *, new: bool = False) -> dict[str, Any]:
    """The ``Thread`` resource: the record plus values and interrupts read from its head.
    ``new``: the thread was created by this request and nothing was written to it, so it has no
    head to read (finding its graph and reading the state was most of a ``POST /threads``)."""
    snapshot = None if new else await read_state(await thread_accessor(runtime, thread), thread.thread_id)
    error = None
    if thread.status == "error":
        newest = await runtime.store.list_runs(thread.thread_id, limit=1)
        error = newest[0].error if newest else None
    return {
        "thread_id": thread.thread_id,
        "created_at": thread.created_at.isoformat(),
        "updated_at": thread.updated_at.isoformat(),
        "state_updated_at": snapshot.created_at if snapshot else thread.updated_at.isoformat(),
        "metadata": thread.metadata,
        "status": thread.status,
        "config": {},
        "values": to_jsonable(snapshot.values) if snapshot else None,
        "interrupts": {t.id: _interrupts(t.interrupts) for t in snapshot.tasks if t.interrupts} if snapshot else {},
        "error": error,
    }
