"""Assistants in dicts: unit tests and ``memory://``; same semantics as the SQL store."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from agentkeel.runtime.records import utcnow
from agentkeel.runtime.stores.assistants import (
    Assistant,
    AssistantExists,
    AssistantPatch,
    AssistantQuery,
    AssistantStore,
    IfExists,
    check_metadata_filter,
    visible_to,
)


def _copy(assistant: Assistant) -> Assistant:
    """A detached copy whose JSON fields went through ``json``, as a database would store them."""
    return replace(
        assistant,
        config=json.loads(json.dumps(assistant.config)),
        context=json.loads(json.dumps(assistant.context)),
        metadata=json.loads(json.dumps(assistant.metadata)),
    )


def _matches_metadata(assistant: Assistant, metadata: dict[str, Any] | None) -> bool:
    return all(k in assistant.metadata and assistant.metadata[k] == v for k, v in (metadata or {}).items())


class MemoryAssistantStore(AssistantStore):
    """Assistants in dicts: unit tests and ``memory://``; same semantics as the SQL store."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._current: dict[str, Assistant] = {}
        self._versions: dict[str, dict[int, Assistant]] = {}

    async def create(self, assistant: Assistant, if_exists: IfExists = "raise") -> Assistant:
        async with self._lock:
            existing = self._current.get(assistant.assistant_id)
            if existing is not None:
                if if_exists == "raise":
                    raise AssistantExists(f"assistant {assistant.assistant_id} already exists")
                return _copy(existing)
            now = utcnow()
            stored = _copy(replace(assistant, version=1, created_at=now, updated_at=now))
            self._current[stored.assistant_id] = stored
            self._versions[stored.assistant_id] = {1: _copy(stored)}
            return _copy(stored)

    async def get(self, assistant_id: str) -> Assistant | None:
        async with self._lock:
            found = self._current.get(assistant_id)
            return _copy(found) if found else None

    async def update(self, assistant_id: str, patch: AssistantPatch) -> Assistant | None:
        async with self._lock:
            current = self._current.get(assistant_id)
            if current is None:
                return None
            now = utcnow()
            versions = self._versions[assistant_id]
            updated = _copy(patch.apply(current, max(versions) + 1, now))
            self._current[assistant_id] = updated
            versions[updated.version] = replace(_copy(updated), created_at=now)
            return _copy(updated)

    async def delete(self, assistant_id: str) -> bool:
        async with self._lock:
            self._versions.pop(assistant_id, None)
            return self._current.pop(assistant_id, None) is not None

    def _matching(self, query: AssistantQuery) -> list[Assistant]:
        name = (query.name or "").lower()
        return [
            a for a in self._current.values()
            if (query.graph_id is None or a.graph_id == query.graph_id)
            and name in a.name.lower()
            and _matches_metadata(a, query.metadata)
            and visible_to(a, query.visible_to)
        ]

    async def search(self, query: AssistantQuery) -> tuple[list[Assistant], int]:
        async with self._lock:
            found = sorted(
                self._matching(query),
                key=lambda a: (getattr(a, query.sort_by), a.assistant_id),
                reverse=query.sort_order == "desc",
            )
            page = found[query.offset : query.offset + query.limit]
            return [_copy(a) for a in page], len(found)

    async def count(self, query: AssistantQuery) -> int:
        async with self._lock:
            return len(self._matching(query))

    async def versions(
        self, assistant_id: str, metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0
    ) -> list[Assistant]:
        check_metadata_filter(metadata)
        async with self._lock:
            stored = self._versions.get(assistant_id, {})
            found = [stored[v] for v in sorted(stored, reverse=True) if _matches_metadata(stored[v], metadata)]
            return [_version_view(a) for a in found[offset : offset + limit]]

    async def set_latest(self, assistant_id: str, version: int) -> Assistant | None:
        async with self._lock:
            current = self._current.get(assistant_id)
            chosen = self._versions.get(assistant_id, {}).get(version)
            if current is None or chosen is None:
                return None
            latest = _copy(replace(chosen, created_at=current.created_at, updated_at=utcnow()))
            self._current[assistant_id] = latest
            return _copy(latest)


def _version_view(version: Assistant) -> Assistant:
    """A stored version as listed: both timestamps are when that version was written."""
    return replace(_copy(version), updated_at=version.created_at)
