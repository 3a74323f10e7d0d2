"""Turning stream chunks and graph values into JSON-safe data for the bridge and the stores."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel

Memo = dict[int, tuple[Any, Any]]


def to_jsonable(value: Any, memo: Memo | None = None) -> Any:
    """Recursively convert messages, pydantic models, dataclasses, interrupts and tuples.

    ``memo`` (one per run) remembers converted pydantic objects by identity: a ``values`` stream
    re-sends every message of the thread at every step, so without it a run converts O(n²)
    messages. Messages are treated as immutable once emitted, as LangGraph's reducers do.
    """
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, memo) for k, v in value.items() if not str(k).startswith("__pregel")}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v, memo) for v in value]
    if isinstance(value, BaseModel):
        if memo is None:
            return to_jsonable(value.model_dump())
        hit = memo.get(id(value))
        if hit is None or hit[0] is not value:
            hit = memo[id(value)] = (value, to_jsonable(value.model_dump(), memo))
        return hit[1]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if hasattr(value, "value") and hasattr(value, "id") and type(value).__name__ == "Interrupt":
        return {"value": to_jsonable(value.value), "id": value.id}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
