"""The key-value store (``/store/...``): LangGraph's ``BaseStore`` of the runtime, over HTTP.

The same store graphs use as ``store``, so items a client writes here are what a graph reads. A
namespace is a list of labels; ``GET`` takes it dot-joined, which is why labels cannot contain a
dot. TTLs are in minutes, as in LangGraph. With authentication a caller uses only its own
namespaces, those whose first label is its user id (``access.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Response
from langgraph.store.base import InvalidNamespaceError
from pydantic import BaseModel, Field, field_validator

from agentkeel.gateway.access import Access, Caller
from agentkeel.gateway.input_limits import MAX_OFFSET, MAX_PAGE, check_filter_keys

router = APIRouter()
FILTER_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})  # LangGraph's store filters


class ItemPut(BaseModel):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    index: Literal[False] | list[str] | None = None
    ttl: float | None = None


class ItemDelete(BaseModel):
    namespace: list[str]
    key: str


class ItemSearch(BaseModel):
    namespace_prefix: list[str] = Field(default_factory=list)
    filter: dict[str, Any] | None = None
    limit: int = Field(10, ge=0, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    query: str | None = None
    refresh_ttl: bool | None = None

    _filter_keys = field_validator("filter")(check_filter_keys)

    @field_validator("filter")
    @classmethod
    def _filter_operators(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A dict value is a set of comparisons; the stores raised on any other operator (a 500
        the fuzzer found)."""
        for key, condition in (value or {}).items():
            unknown = sorted(set(condition) - FILTER_OPERATORS) if isinstance(condition, dict) else []
            if unknown:
                raise ValueError(f"{key}: unknown operator {unknown[0][:100]!r}; known: {sorted(FILTER_OPERATORS)}")
        return value


class NamespaceSearch(BaseModel):
    prefix: list[str] | None = None
    suffix: list[str] | None = None
    max_depth: int | None = Field(None, ge=1)
    limit: int = Field(100, ge=0, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


def _namespace(labels: list[str], field: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    if not labels and not allow_empty:
        raise HTTPException(422, f"{field}: must name at least one label")
    for label in labels:
        if not label:
            raise HTTPException(422, f"{field}: labels must not be empty")
        if "." in label:
            raise HTTPException(422, f"{field}: label {label!r} must not contain '.'")
    return tuple(labels)


def _invalid(field: str, exc: Exception) -> HTTPException:
    return HTTPException(422, f"{field}: {exc}")


async def _owned(access: Access, action: str, labels: tuple[str, ...], field: str, **value: Any) -> tuple[str, ...]:
    """The namespace the caller may use (``access.namespace``: its own, after the rules)."""
    return await access.namespace(action, {"namespace": labels, **value}, field)


@router.put("/store/items", status_code=204)
async def put_item(body: ItemPut, access: Caller) -> Response:
    namespace = await _owned(access, "put", _namespace(body.namespace, "namespace"), "namespace",
                             key=body.key, value=body.value, index=body.index, ttl=body.ttl)
    store = access.runtime.kv_store
    if body.ttl is not None and not store.supports_ttl:
        raise HTTPException(422, "ttl: this server's store (memory://) does not support TTLs")
    try:
        await store.aput(namespace, body.key, body.value, index=body.index, ttl=body.ttl)
    except InvalidNamespaceError as exc:
        raise _invalid("namespace", exc) from None
    return Response(status_code=204)


@router.get("/store/items")
async def get_item(namespace: str, key: str, access: Caller, refresh_ttl: bool | None = None) -> Any:
    """The item, or JSON ``null`` when there is none (200 either way, like the official server)."""
    labels = _namespace(namespace.split(".") if namespace else [], "namespace")
    labels = await _owned(access, "get", labels, "namespace", key=key)
    try:
        item = await access.runtime.kv_store.aget(labels, key, refresh_ttl=refresh_ttl)
    except InvalidNamespaceError as exc:
        raise _invalid("namespace", exc) from None
    return item.dict() if item is not None else None


@router.delete("/store/items", status_code=204)
async def delete_item(body: ItemDelete, access: Caller) -> Response:
    namespace = await _owned(access, "delete", _namespace(body.namespace, "namespace"), "namespace", key=body.key)
    try:
        await access.runtime.kv_store.adelete(namespace, body.key)
    except InvalidNamespaceError as exc:
        raise _invalid("namespace", exc) from None
    return Response(status_code=204)


@router.post("/store/items/search")
async def search_items(body: ItemSearch, access: Caller) -> dict[str, Any]:
    prefix = _namespace(body.namespace_prefix, "namespace_prefix", allow_empty=True)
    prefix = await _owned(access, "search", prefix, "namespace_prefix", filter=body.filter, limit=body.limit,
                          offset=body.offset, query=body.query)
    try:
        items = await access.runtime.kv_store.asearch(
            prefix, query=body.query, filter=body.filter, limit=body.limit, offset=body.offset,
            refresh_ttl=body.refresh_ttl,
        )
    except InvalidNamespaceError as exc:
        raise _invalid("namespace_prefix", exc) from None
    return {"items": [item.dict() for item in items]}


@router.post("/store/namespaces")
async def list_namespaces(body: NamespaceSearch, access: Caller) -> dict[str, Any]:
    prefix = _namespace(body.prefix, "prefix", allow_empty=True) if body.prefix else ()
    owned = await _owned(access, "list_namespaces", prefix, "prefix", suffix=body.suffix,
                         max_depth=body.max_depth, limit=body.limit, offset=body.offset)
    suffix = _namespace(body.suffix, "suffix", allow_empty=True) if body.suffix else None
    namespaces = await access.runtime.kv_store.alist_namespaces(
        prefix=owned or None, suffix=suffix, max_depth=body.max_depth, limit=body.limit, offset=body.offset
    )
    return {"namespaces": [list(ns) for ns in namespaces]}
