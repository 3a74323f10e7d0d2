"""Assistants: system assistants (one per configured assistant and graph) and user-created ones.

Every route that takes an assistant id also takes a configured name (its system assistant), unlike
the official server, which answers 422 there: a name is unambiguous, and refusing it helps nobody.
Graph, schemas and subgraphs describe the assistant's compiled graph as this process builds it.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Response
from langgraph.pregel import Pregel
from pydantic import BaseModel, Field

from agentkeel.gateway.access import Access, Caller
from agentkeel.gateway.graph_schemas import (
    graph_schemas,
    graph_structure,
    subgraph_schemas,
)
from agentkeel.gateway.input_limits import MAX_OFFSET, MAX_PAGE
from agentkeel.runtime.records import ConflictError
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.stores.assistants import (
    Assistant,
    AssistantExists,
    AssistantPatch,
    AssistantQuery,
)
from agentkeel.runtime.threads import delete_thread, list_all_threads

router = APIRouter()

SortBy = Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"]


class AssistantCreate(BaseModel):
    graph_id: str
    assistant_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    context: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"
    name: str | None = None
    description: str | None = None


class AssistantUpdate(BaseModel):
    graph_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None


class AssistantCount(BaseModel):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None


class AssistantSearch(AssistantCount):
    limit: int = Field(10, ge=0, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    sort_by: SortBy = "created_at"
    sort_order: Literal["asc", "desc"] = "desc"
    select: list[str] | None = None


class VersionsQuery(BaseModel):
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=0, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


class SetLatest(BaseModel):
    version: int


def _check_graph(runtime: Runtime, graph_id: str) -> None:
    known = runtime.harness.assistant_ids
    if graph_id not in known:
        raise HTTPException(422, f"graph_id: graph {graph_id!r} is not configured; configured: {known}")


def _query(body: AssistantCount, access: Access, **page: Any) -> AssistantQuery:
    try:
        return AssistantQuery(metadata=body.metadata, graph_id=body.graph_id, name=body.name,
                              visible_to=access.assistants_visible_to, **page)
    except ValueError as exc:
        raise HTTPException(422, f"metadata: {exc}") from None


async def _ruled(access: Access, body: AssistantCount, **order: Any) -> list[Assistant] | None:
    """With an ``@auth.on`` filter for searches: every match the rule lets through, in order
    (filtered here: the rule's operators are not the store's); None without one."""
    found = await access.authorize("assistants", "search", body.model_dump())
    if found is None:
        return None
    kept: list[Assistant] = []
    offset = 0
    while True:
        batch, total = await access.runtime.assistants.search(_query(body, access, limit=MAX_PAGE, offset=offset, **order))
        kept.extend(a for a in batch if access.sees_assistant(a, found))
        offset += len(batch)
        if not batch or offset >= total:
            return kept


async def _graph(access: Access, assistant_id: str) -> tuple[str, Pregel]:
    assistant = await access.assistant(assistant_id)
    runtime = access.runtime
    if assistant.graph_id not in runtime.harness.assistant_ids:
        raise HTTPException(404, f"Graph {assistant.graph_id!r} of assistant {assistant_id} is not configured")
    return assistant.graph_id, (await runtime.accessor(assistant.graph_id)).graph


# -- collection -------------------------------------------------------------------------------------
@router.post("/assistants")
async def create_assistant(body: AssistantCreate, access: Caller) -> dict[str, Any]:
    """The new assistant is the caller's; ``if_exists=do_nothing`` on another user's id is 409."""
    runtime = access.runtime
    _check_graph(runtime, body.graph_id)
    assistant_id = body.assistant_id or str(uuid.uuid4())
    try:
        assistant_id = str(uuid.UUID(assistant_id))
    except ValueError:
        raise HTTPException(422, "assistant_id: must be a UUID") from None
    value = {**body.model_dump(), "assistant_id": assistant_id}
    found = await access.authorize("assistants", "create", value)  # may change value["metadata"]
    assistant = Assistant(
        assistant_id=assistant_id, graph_id=body.graph_id, config=body.config, context=body.context,
        metadata=access.owned(value["metadata"]), name=body.name or body.graph_id, description=body.description,
    )
    try:
        stored = await runtime.assistants.create(assistant, body.if_exists)
    except AssistantExists as exc:
        raise HTTPException(409, str(exc)) from None
    if not access.sees_assistant(stored, found):  # do_nothing found someone else's
        raise HTTPException(409, f"assistant {assistant_id} already exists")
    return stored.to_dict()


@router.post("/assistants/search")
async def search_assistants(body: AssistantSearch, access: Caller, response: Response) -> list[dict[str, Any]]:
    order = {"sort_by": body.sort_by, "sort_order": body.sort_order}
    ruled = await _ruled(access, AssistantCount(**body.model_dump(include={"metadata", "graph_id", "name"})), **order)
    if ruled is None:
        page, total = await access.runtime.assistants.search(
            _query(body, access, limit=body.limit, offset=body.offset, **order)
        )
    else:
        page, total = ruled[body.offset : body.offset + body.limit], len(ruled)
    response.headers["X-Pagination-Total"] = str(total)
    if body.offset + len(page) < total:
        response.headers["X-Pagination-Next"] = str(body.offset + len(page))
    views = [a.to_dict() for a in page]
    if body.select:
        views = [{k: v for k, v in view.items() if k in body.select} for view in views]
    return views


@router.post("/assistants/count")
async def count_assistants(body: AssistantCount, access: Caller) -> int:
    ruled = await _ruled(access, body)
    return len(ruled) if ruled is not None else await access.runtime.assistants.count(_query(body, access))


# -- one assistant ----------------------------------------------------------------------------------
@router.get("/assistants/{assistant_id}")
async def get_assistant(assistant_id: str, access: Caller) -> dict[str, Any]:
    return (await access.assistant(assistant_id)).to_dict()


@router.patch("/assistants/{assistant_id}")
async def update_assistant(assistant_id: str, body: AssistantUpdate, access: Caller) -> dict[str, Any]:
    """A new version with the given fields (metadata merged); it becomes the current one."""
    runtime = access.runtime
    current = await access.assistant(assistant_id, "update", **body.model_dump(exclude_none=True))
    access.check_owner_change(body.metadata or {}, current.metadata)
    if body.graph_id is not None:
        _check_graph(runtime, body.graph_id)
        if current.is_system and body.graph_id != current.graph_id:
            raise HTTPException(409, f"graph_id: the system assistant of {current.graph_id!r} keeps its graph")
    patch = AssistantPatch(**body.model_dump())
    updated = await runtime.assistants.update(current.assistant_id, patch)
    if updated is None:  # deleted meanwhile
        raise HTTPException(404, f"Assistant {assistant_id} not found")
    return updated.to_dict()


@router.delete("/assistants/{assistant_id}", status_code=204)
async def delete_assistant(assistant_id: str, access: Caller, delete_threads: bool = False) -> Response:
    """``delete_threads=true`` also deletes the caller's threads whose ``assistant_id`` metadata
    names it."""
    runtime = access.runtime
    current = await access.assistant(assistant_id, "delete")
    if current.is_system:
        raise HTTPException(409, f"Assistant {assistant_id} is the system assistant of {current.graph_id!r}")
    if delete_threads:
        for thread in await list_all_threads(runtime.store):
            if thread.metadata.get("assistant_id") in (assistant_id, current.assistant_id) and access.owns(thread.metadata):
                try:
                    await delete_thread(runtime, thread.thread_id)
                except ConflictError as exc:
                    raise HTTPException(409, str(exc)) from None
    await runtime.assistants.delete(current.assistant_id)
    return Response(status_code=204)


@router.get("/assistants/{assistant_id}/graph")
async def get_assistant_graph(assistant_id: str, access: Caller, xray: str = "false") -> dict[str, Any]:
    """``xray``: true/false, or how many levels of subgraphs to expand."""
    lowered = xray.lower()
    if lowered in ("true", "false"):
        depth: bool | int = lowered == "true"
    elif xray.isdigit():
        depth = int(xray)
    else:
        raise HTTPException(422, "xray: must be true, false or a non-negative integer")
    _, graph = await _graph(access, assistant_id)
    return await graph_structure(graph, depth)


@router.get("/assistants/{assistant_id}/schemas")
async def get_assistant_schemas(assistant_id: str, access: Caller) -> dict[str, Any]:
    graph_id, graph = await _graph(access, assistant_id)
    return graph_schemas(graph_id, graph)


@router.get("/assistants/{assistant_id}/subgraphs")
@router.get("/assistants/{assistant_id}/subgraphs/{namespace}")
async def get_assistant_subgraphs(
    assistant_id: str, access: Caller, namespace: str | None = None, recurse: bool = False
) -> dict[str, Any]:
    graph_id, graph = await _graph(access, assistant_id)
    return await subgraph_schemas(graph_id, graph, namespace, recurse)


@router.post("/assistants/{assistant_id}/versions")
async def list_versions(assistant_id: str, body: VersionsQuery, access: Caller) -> list[dict[str, Any]]:
    current = await access.assistant(assistant_id)
    try:
        versions = await access.runtime.assistants.versions(current.assistant_id, body.metadata, body.limit, body.offset)
    except ValueError as exc:
        raise HTTPException(422, f"metadata: {exc}") from None
    return [v.to_dict() for v in versions]


@router.post("/assistants/{assistant_id}/latest")
async def set_latest_version(assistant_id: str, body: SetLatest, access: Caller) -> dict[str, Any]:
    current = await access.assistant(assistant_id, "update")
    latest = await access.runtime.assistants.set_latest(current.assistant_id, body.version)
    if latest is None:
        raise HTTPException(404, f"Assistant {assistant_id} has no version {body.version}")
    return latest.to_dict()
