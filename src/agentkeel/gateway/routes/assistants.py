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

from agentkeel.gateway.graph_schemas import (
    graph_schemas,
    graph_structure,
    subgraph_schemas,
)
from agentkeel.gateway.input_limits import MAX_OFFSET, MAX_PAGE
from agentkeel.gateway.runtime_dep import RuntimeDep
from agentkeel.runtime.assistants import assistant_key
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


def _query(body: AssistantCount, **page: Any) -> AssistantQuery:
    try:
        return AssistantQuery(metadata=body.metadata, graph_id=body.graph_id, name=body.name, **page)
    except ValueError as exc:
        raise HTTPException(422, f"metadata: {exc}") from None


async def _existing(runtime: Runtime, assistant_id: str) -> Assistant:
    found = await runtime.assistants.get(assistant_key(assistant_id))
    if found is None:
        raise HTTPException(404, f"Assistant {assistant_id} not found")
    return found


async def _graph(runtime: Runtime, assistant_id: str) -> tuple[str, Pregel]:
    assistant = await _existing(runtime, assistant_id)
    if assistant.graph_id not in runtime.harness.assistant_ids:
        raise HTTPException(404, f"Graph {assistant.graph_id!r} of assistant {assistant_id} is not configured")
    return assistant.graph_id, (await runtime.accessor(assistant.graph_id)).graph


# -- collection -------------------------------------------------------------------------------------
@router.post("/assistants")
async def create_assistant(body: AssistantCreate, runtime: RuntimeDep) -> dict[str, Any]:
    _check_graph(runtime, body.graph_id)
    assistant_id = body.assistant_id or str(uuid.uuid4())
    try:
        assistant_id = str(uuid.UUID(assistant_id))
    except ValueError:
        raise HTTPException(422, "assistant_id: must be a UUID") from None
    assistant = Assistant(
        assistant_id=assistant_id, graph_id=body.graph_id, config=body.config, context=body.context,
        metadata=body.metadata, name=body.name or body.graph_id, description=body.description,
    )
    try:
        return (await runtime.assistants.create(assistant, body.if_exists)).to_dict()
    except AssistantExists as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/assistants/search")
async def search_assistants(body: AssistantSearch, runtime: RuntimeDep, response: Response) -> list[dict[str, Any]]:
    query = _query(body, limit=body.limit, offset=body.offset, sort_by=body.sort_by, sort_order=body.sort_order)
    page, total = await runtime.assistants.search(query)
    response.headers["X-Pagination-Total"] = str(total)
    if body.offset + len(page) < total:
        response.headers["X-Pagination-Next"] = str(body.offset + len(page))
    views = [a.to_dict() for a in page]
    if body.select:
        views = [{k: v for k, v in view.items() if k in body.select} for view in views]
    return views


@router.post("/assistants/count")
async def count_assistants(body: AssistantCount, runtime: RuntimeDep) -> int:
    return await runtime.assistants.count(_query(body))


# -- one assistant ----------------------------------------------------------------------------------
@router.get("/assistants/{assistant_id}")
async def get_assistant(assistant_id: str, runtime: RuntimeDep) -> dict[str, Any]:
    return (await _existing(runtime, assistant_id)).to_dict()


@router.patch("/assistants/{assistant_id}")
async def update_assistant(assistant_id: str, body: AssistantUpdate, runtime: RuntimeDep) -> dict[str, Any]:
    """A new version with the given fields (metadata merged); it becomes the current one."""
    current = await _existing(runtime, assistant_id)
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
async def delete_assistant(assistant_id: str, runtime: RuntimeDep, delete_threads: bool = False) -> Response:
    """``delete_threads=true`` also deletes the threads whose ``assistant_id`` metadata names it."""
    current = await _existing(runtime, assistant_id)
    if current.is_system:
        raise HTTPException(409, f"Assistant {assistant_id} is the system assistant of {current.graph_id!r}")
    if delete_threads:
        for thread in await list_all_threads(runtime.store):
            if thread.metadata.get("assistant_id") in (assistant_id, current.assistant_id):
                try:
                    await delete_thread(runtime, thread.thread_id)
                except ConflictError as exc:
                    raise HTTPException(409, str(exc)) from None
    await runtime.assistants.delete(current.assistant_id)
    return Response(status_code=204)


@router.get("/assistants/{assistant_id}/graph")
async def get_assistant_graph(assistant_id: str, runtime: RuntimeDep, xray: str = "false") -> dict[str, Any]:
    """``xray``: true/false, or how many levels of subgraphs to expand."""
    lowered = xray.lower()
    if lowered in ("true", "false"):
        depth: bool | int = lowered == "true"
    elif xray.isdigit():
        depth = int(xray)
    else:
        raise HTTPException(422, "xray: must be true, false or a non-negative integer")
    _, graph = await _graph(runtime, assistant_id)
    return await graph_structure(graph, depth)


@router.get("/assistants/{assistant_id}/schemas")
async def get_assistant_schemas(assistant_id: str, runtime: RuntimeDep) -> dict[str, Any]:
    graph_id, graph = await _graph(runtime, assistant_id)
    return graph_schemas(graph_id, graph)


@router.get("/assistants/{assistant_id}/subgraphs")
@router.get("/assistants/{assistant_id}/subgraphs/{namespace}")
async def get_assistant_subgraphs(
    assistant_id: str, runtime: RuntimeDep, namespace: str | None = None, recurse: bool = False
) -> dict[str, Any]:
    graph_id, graph = await _graph(runtime, assistant_id)
    return await subgraph_schemas(graph_id, graph, namespace, recurse)


@router.post("/assistants/{assistant_id}/versions")
async def list_versions(assistant_id: str, body: VersionsQuery, runtime: RuntimeDep) -> list[dict[str, Any]]:
    current = await _existing(runtime, assistant_id)
    try:
        versions = await runtime.assistants.versions(current.assistant_id, body.metadata, body.limit, body.offset)
    except ValueError as exc:
        raise HTTPException(422, f"metadata: {exc}") from None
    return [v.to_dict() for v in versions]


@router.post("/assistants/{assistant_id}/latest")
async def set_latest_version(assistant_id: str, body: SetLatest, runtime: RuntimeDep) -> dict[str, Any]:
    current = await _existing(runtime, assistant_id)
    latest = await runtime.assistants.set_latest(current.assistant_id, body.version)
    if latest is None:
        raise HTTPException(404, f"Assistant {assistant_id} has no version {body.version}")
    return latest.to_dict()
