"""Threads: create, read, update, delete, search, count, copy (state and history: ``thread_state``).

A thread's record (status, metadata) lives in the run store; its values and interrupts are read
from its newest checkpoint on every request, so they are never stale.

Search and count filter in this process: the run store lists threads but does not filter them, so
a search reads every thread record (and, with a ``values`` filter, the state of every thread that
passed the other filters). Fine for the thread counts of one deployment; a store-side query is the
fix if that stops being true.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Header, HTTPException, Response
from langgraph.errors import InvalidUpdateError
from langgraph.types import StateUpdate
from pydantic import BaseModel, Field

from agentkeel.gateway.access import OWNER, Access, Caller
from agentkeel.gateway.input_limits import MAX_OFFSET, MAX_PAGE, Id
from agentkeel.gateway.routes import thread_state, thread_stream
from agentkeel.gateway.threads_view import (
    read_state,
    select_fields,
    state_config,
    thread_accessor,
    thread_view,
)
from agentkeel.runtime.checkpoints import mark_checkpoint_mode
from agentkeel.runtime.records import ConflictError, ThreadRecord
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.serialization import to_jsonable
from agentkeel.runtime.thread_status import settled_status
from agentkeel.runtime.threads import (
    copy_thread,
    delete_thread,
    is_valid_thread_id,
    list_all_threads,
)

router = APIRouter()
router.include_router(thread_state.router)
router.include_router(thread_stream.router)

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]


class StateUpdateBody(BaseModel):
    values: Any = None
    command: dict[str, Any] | None = None
    as_node: str | None = None


class Superstep(BaseModel):
    updates: list[StateUpdateBody]


class ThreadCreate(BaseModel):
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    supersteps: list[Superstep] | None = None
    ttl: Any = None


class ThreadPatch(BaseModel):
    metadata: dict[str, Any] | None = None
    ttl: Any = None


class ThreadCount(BaseModel):
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: ThreadStatus | None = None


class ThreadSearch(ThreadCount):
    ids: list[Id] | None = None
    limit: int = Field(10, ge=0, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] = "updated_at"
    sort_order: Literal["asc", "desc"] = "desc"
    select: list[str] | None = None
    extract: dict[str, Any] | None = None


def _unprocessable(field: str, message: str) -> HTTPException:
    return HTTPException(422, f"{field}: {message}")


def _refuse_ttl(ttl: Any) -> None:
    if ttl is not None:
        raise _unprocessable("ttl", "thread TTLs are not supported by this server")


# -- create -----------------------------------------------------------------------------------------
@router.post("/threads")
async def create_thread(body: ThreadCreate, access: Caller) -> dict[str, Any]:
    """An existing id: 409, or the thread as it is (``if_exists=do_nothing``; another user's is
    409 all the same). Of concurrent creates of one id exactly one creates it."""
    _refuse_ttl(body.ttl)
    runtime = access.runtime
    thread_id = body.thread_id or str(uuid.uuid4())
    if not is_valid_thread_id(thread_id):
        raise _unprocessable("thread_id", "must be 1-128 characters of letters, digits, '_', '.', '-'")
    value: dict[str, Any] = {"thread_id": thread_id, "metadata": dict(body.metadata or {}), "if_exists": body.if_exists}
    found = await access.authorize("threads", "create", value)  # the rule may change value["metadata"]
    updates = _supersteps(body.supersteps or [])
    thread = await runtime.store.create_thread(thread_id, access.owned(value["metadata"]))
    if thread is None:
        existing = await runtime.store.get_thread(thread_id)
        if body.if_exists == "raise" or existing is None or not access.sees(existing.metadata, found):
            raise HTTPException(409, f"Thread with ID {thread_id} already exists")
        return await thread_view(runtime, existing)
    if updates:
        try:
            await _apply_supersteps(runtime, thread, updates)
        except BaseException:
            await delete_thread(runtime, thread_id)  # a refused create leaves nothing behind
            raise
        thread = await access.thread(thread_id)
    return await thread_view(runtime, thread, new=not updates)


def _supersteps(supersteps: list[Superstep]) -> list[list[StateUpdate]]:
    steps = []
    for i, step in enumerate(supersteps):
        for j, update in enumerate(step.updates):
            if update.command is not None:
                raise _unprocessable(
                    f"supersteps[{i}].updates[{j}].command", "commands in supersteps are not supported; use values"
                )
            if update.values is not None and not isinstance(update.values, dict):
                raise _unprocessable(f"supersteps[{i}].updates[{j}].values", "must be an object or null")
        steps.append([StateUpdate(u.values, u.as_node) for u in step.updates])
    return steps


async def _apply_supersteps(runtime: Runtime, thread: ThreadRecord, steps: list[list[StateUpdate]]) -> None:
    """Write the supersteps as the thread's first checkpoints, one checkpoint per superstep."""
    accessor = await thread_accessor(runtime, thread)
    config = mark_checkpoint_mode(state_config(thread.thread_id), accessor.mode)
    try:
        await accessor.graph.abulk_update_state(config, steps)
    except (InvalidUpdateError, ValueError) as exc:
        raise _unprocessable("supersteps", str(exc)) from None
    snapshot = await read_state(accessor, thread.thread_id)
    await runtime.store.set_thread_status(thread.thread_id, settled_status(snapshot))


# -- search and count ---------------------------------------------------------------------------------
def _contains(actual: Any, wanted: dict[str, Any]) -> bool:
    return isinstance(actual, dict) and all(k in actual and actual[k] == v for k, v in wanted.items())


async def _matching(access: Access, body: ThreadCount, ids: list[str] | None = None) -> list[ThreadRecord]:
    runtime = access.runtime
    if ids is None:
        candidates = await list_all_threads(runtime.store)
    else:
        wanted = [t for t in dict.fromkeys(ids) if is_valid_thread_id(t)]
        candidates = [t for t in [await runtime.store.get_thread(i) for i in wanted] if t is not None]
    value = {**body.model_dump(include={"metadata", "values", "status"}), "ids": ids}
    matched = [
        t for t in await access.visible_threads(candidates, value)
        if (body.status is None or t.status == body.status) and _contains(t.metadata, body.metadata or {})
    ]
    if not body.values:
        return matched
    kept = []
    for thread in matched:
        snapshot = await read_state(await thread_accessor(runtime, thread), thread.thread_id)
        if snapshot is not None and _contains(to_jsonable(snapshot.values), body.values):
            kept.append(thread)
    return kept


@router.post("/threads/search")
async def search_threads(body: ThreadSearch, access: Caller, response: Response) -> list[dict[str, Any]]:
    if body.extract is not None:
        raise _unprocessable("extract", "is not supported by this server")
    runtime = access.runtime
    matched = await _matching(access, body, body.ids)
    field = "updated_at" if body.sort_by == "state_updated_at" else body.sort_by
    matched.sort(key=lambda t: (getattr(t, field), t.thread_id), reverse=body.sort_order == "desc")
    page = matched[body.offset : body.offset + body.limit]
    response.headers["X-Pagination-Total"] = str(len(matched))
    if body.offset + len(page) < len(matched):
        response.headers["X-Pagination-Next"] = str(body.offset + len(page))
    return [select_fields(await thread_view(runtime, t), body.select) for t in page]


@router.post("/threads/count")
async def count_threads(body: ThreadCount, access: Caller) -> int:
    return len(await _matching(access, body))


# -- one thread -------------------------------------------------------------------------------------
@router.get("/threads/{thread_id}")
async def get_thread(thread_id: str, access: Caller) -> dict[str, Any]:
    return await thread_view(access.runtime, await access.thread(thread_id))


@router.patch("/threads/{thread_id}", response_model=None)
async def patch_thread(
    thread_id: str, body: ThreadPatch, access: Caller, prefer: str | None = Header(None)
) -> dict[str, Any] | Response:
    """Metadata is merged into the thread's (a key set to null stays, with the value null)."""
    _refuse_ttl(body.ttl)
    metadata = dict(body.metadata or {})
    current = await access.thread(thread_id, "update", metadata=metadata)
    access.check_owner_change(metadata, current.metadata)
    runtime = access.runtime
    thread = await runtime.store.upsert_thread(thread_id, metadata)
    if prefer is not None and "return=minimal" in prefer:
        return Response(status_code=204)
    return await thread_view(runtime, thread)


@router.delete("/threads/{thread_id}", status_code=204)
async def delete_thread_route(thread_id: str, access: Caller) -> Response:
    """204 whether or not the thread existed (with authentication, a missing thread is 404 like
    another user's, so the answer tells nothing); active runs are cancelled first (see
    ``runtime.threads.delete_thread``), 409 if one runs in another process."""
    if access.identity is not None:
        await access.thread(thread_id, "delete")
    if is_valid_thread_id(thread_id):
        try:
            await delete_thread(access.runtime, thread_id)
        except ConflictError as exc:
            raise HTTPException(409, str(exc)) from None
    return Response(status_code=204)


@router.post("/threads/{thread_id}/copy")
async def copy_thread_route(thread_id: str, access: Caller) -> dict[str, Any]:
    """The copy belongs to the caller (an admin copying another user's thread gets its own)."""
    source = await access.thread(thread_id)
    metadata = {**source.metadata, OWNER: access.user_id} if access.identity is not None else None
    copied = await copy_thread(access.runtime, source, str(uuid.uuid4()), metadata)
    return await thread_view(access.runtime, copied)
