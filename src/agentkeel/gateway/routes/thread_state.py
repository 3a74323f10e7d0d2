"""A thread's state and history (``/threads/{thread_id}/state...`` and ``/history``).

Included by ``routes.threads``; shapes and reads are in ``threads_view``. Updating state while a run
of the thread is pending or running is refused (409): the run would overwrite the edit, or run on
a state it did not start from.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from langgraph.errors import InvalidUpdateError
from pydantic import BaseModel, Field, field_validator

from agentkeel.gateway.access import Access, Caller
from agentkeel.gateway.input_limits import MAX_PAGE, check_filter_keys
from agentkeel.gateway.threads_view import (
    checkpoint_view,
    empty_state_view,
    read_history,
    read_state,
    select_fields,
    state_view,
    thread_accessor,
)
from agentkeel.runtime.checkpoints import CheckpointModeError
from agentkeel.runtime.thread_status import settled_status

router = APIRouter()
Select = Annotated[list[str] | None, Query()]  # repeated ?select=... parameters


class CheckpointRef(BaseModel):
    thread_id: str | None = None
    checkpoint_ns: str = ""
    checkpoint_id: str | None = None
    checkpoint_map: dict[str, Any] | None = None


class StateAt(BaseModel):
    checkpoint: CheckpointRef
    subgraphs: bool = False
    select: list[str] | None = None


class StateUpdateRequest(BaseModel):
    values: Any = None
    as_node: str | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None


class HistoryQuery(BaseModel):
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    before: str | CheckpointRef | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None
    select: list[str] | None = None

    _metadata_keys = field_validator("metadata")(check_filter_keys)


async def _state(
    access: Access, thread_id: str, checkpoint: dict[str, Any] | None, subgraphs: bool, select: list[str] | None
) -> dict[str, Any]:
    thread = await access.thread(thread_id)
    snapshot = await read_state(await thread_accessor(access.runtime, thread), thread_id, checkpoint, subgraphs)
    if snapshot is None:
        if checkpoint and checkpoint.get("checkpoint_id"):
            raise HTTPException(404, f"Checkpoint {checkpoint['checkpoint_id']} of thread {thread_id} not found")
        return select_fields(empty_state_view(thread_id), select)
    return select_fields(state_view(snapshot), select)


@router.get("/threads/{thread_id}/state")
async def get_state(
    thread_id: str, access: Caller, subgraphs: bool = False, select: Select = None
) -> dict[str, Any]:
    return await _state(access, thread_id, None, subgraphs, select)


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def get_state_at(
    thread_id: str, checkpoint_id: str, access: Caller, subgraphs: bool = False, select: Select = None
) -> dict[str, Any]:
    return await _state(access, thread_id, {"checkpoint_id": checkpoint_id}, subgraphs, select)


@router.post("/threads/{thread_id}/state/checkpoint")
async def post_state_at(thread_id: str, body: StateAt, access: Caller) -> dict[str, Any]:
    return await _state(access, thread_id, body.checkpoint.model_dump(), body.subgraphs, body.select)


@router.post("/threads/{thread_id}/state")
async def update_state(thread_id: str, body: StateUpdateRequest, access: Caller) -> dict[str, Any]:
    """As if ``as_node`` had returned ``values`` (LangGraph's ``update_state``), on the head or
    on ``checkpoint_id`` (forking from it). Subgraph state cannot be updated (422)."""
    thread = await access.thread(thread_id, "update")
    runtime = access.runtime
    if body.checkpoint is not None and body.checkpoint.checkpoint_ns:
        raise HTTPException(422, "checkpoint.checkpoint_ns: updating a subgraph's state is not supported")
    if await runtime.store.active_runs(thread_id):
        raise HTTPException(409, f"Thread {thread_id} has an active run; update its state once the run has ended")
    checkpoint_id = body.checkpoint_id or (body.checkpoint.checkpoint_id if body.checkpoint else None)
    accessor = await thread_accessor(runtime, thread)
    try:
        if checkpoint_id is not None and await accessor.araw_tuple(thread_id, checkpoint_id) is None:
            raise HTTPException(404, f"Checkpoint {checkpoint_id} of thread {thread_id} not found")
        config = await accessor.aupdate(thread_id, body.values, as_node=body.as_node, checkpoint_id=checkpoint_id)
    except CheckpointModeError as exc:
        raise HTTPException(409, str(exc)) from None
    except (InvalidUpdateError, ValueError) as exc:
        raise HTTPException(422, f"{'as_node' if body.as_node else 'values'}: {exc}") from None
    snapshot = await read_state(accessor, thread_id)
    await runtime.store.set_thread_status(thread_id, settled_status(snapshot))
    return {"checkpoint": checkpoint_view(config)}


async def _history(access: Access, thread_id: str, query: HistoryQuery) -> list[dict[str, Any]]:
    thread = await access.thread(thread_id)
    before = query.before.checkpoint_id if isinstance(query.before, CheckpointRef) else query.before
    history = await read_history(
        await thread_accessor(access.runtime, thread), thread_id, limit=query.limit, before=before,
        metadata=query.metadata, checkpoint=query.checkpoint.model_dump() if query.checkpoint else None,
    )
    return [select_fields(state_view(s), query.select) for s in history]


@router.get("/threads/{thread_id}/history")
async def get_history(
    thread_id: str, access: Caller, limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 10, before: str | None = None
) -> list[dict[str, Any]]:
    return await _history(access, thread_id, HistoryQuery(limit=limit, before=before))


@router.post("/threads/{thread_id}/history")
async def post_history(thread_id: str, body: HistoryQuery, access: Caller) -> list[dict[str, Any]]:
    return await _history(access, thread_id, body)
