"""Assistants: versioned configurations of a graph, and the store that keeps them.

Every configured assistant (``assistants:``) and graph (``graphs:``) has a *system* assistant whose
id is ``uuid5(SYSTEM_NAMESPACE, name)`` -- the id the official server gives it, so clients that
computed it themselves keep working. System assistants are written to the store at start-up
(``ensure_system_assistants``) instead of being synthesised on every read: search, count, sorting
and pagination then treat system and user assistants alike, in the database.

A configured name is also accepted wherever an assistant id is (``assistant_key`` maps it to the
system id), which is how run payloads name assistants in practice.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from agentkeel.runtime.records import ConflictError, utcnow
from agentkeel.runtime.requests import RequestError

if TYPE_CHECKING:
    from agentkeel.runtime.runtime import Runtime

SYSTEM_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
SYSTEM_METADATA = {"created_by": "system"}
SORT_FIELDS = ("assistant_id", "graph_id", "name", "created_at", "updated_at")
IfExists = Literal["raise", "do_nothing"]


class AssistantExists(ConflictError):
    """``create`` with ``if_exists="raise"`` met an existing id."""


def system_assistant_id(name: str) -> str:
    return str(uuid.uuid5(SYSTEM_NAMESPACE, name))


def assistant_key(assistant_id: str) -> str:
    """The stored id an assistant reference means: a UUID as itself, anything else as a name."""
    try:
        return str(uuid.UUID(assistant_id))
    except ValueError:
        return system_assistant_id(assistant_id)


@dataclass
class Assistant:
    """One assistant at its current version (or, in a version list, at that version)."""

    assistant_id: str
    graph_id: str
    config: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    description: str | None = None
    version: int = 1
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)

    @property
    def is_system(self) -> bool:
        return self.assistant_id == system_assistant_id(self.graph_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "assistant_id": self.assistant_id,
            "graph_id": self.graph_id,
            "config": self.config,
            "context": self.context,
            "metadata": self.metadata,
            "name": self.name,
            "description": self.description,
            "version": self.version,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True)
class AssistantPatch:
    """A PATCH: None leaves a field as it is; ``metadata`` is merged, the others replace."""

    graph_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None

    def apply(self, current: Assistant, version: int, now: datetime) -> Assistant:
        return replace(
            current,
            graph_id=self.graph_id if self.graph_id is not None else current.graph_id,
            config=self.config if self.config is not None else current.config,
            context=self.context if self.context is not None else current.context,
            metadata={**current.metadata, **(self.metadata or {})},
            name=self.name if self.name is not None else current.name,
            description=self.description if self.description is not None else current.description,
            version=version,
            updated_at=now,
        )


@dataclass(frozen=True)
class AssistantQuery:
    """Filters of search and count. ``metadata`` matches top-level keys exactly; ``name`` is a
    case-insensitive substring."""

    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = 10
    offset: int = 0
    sort_by: str = "created_at"
    sort_order: Literal["asc", "desc"] = "desc"

    def __post_init__(self) -> None:
        check_metadata_filter(self.metadata)
        if self.sort_by not in SORT_FIELDS:
            raise ValueError(f"sort_by must be one of {list(SORT_FIELDS)}, got {self.sort_by!r}")
        if self.sort_order not in ("asc", "desc"):
            raise ValueError(f"sort_order must be asc or desc, got {self.sort_order!r}")


def check_metadata_filter(metadata: dict[str, Any] | None) -> None:
    """Filter keys become JSON paths in SQL; a key SQLite's path syntax cannot quote is refused
    on every backend, so the backends cannot disagree about it."""
    for key in metadata or {}:
        if not isinstance(key, str) or '"' in key:
            raise ValueError(f"metadata filter key {key!r} must be a string without '\"'")


class AssistantStore(ABC):
    """Assistants and their version history. Every method is one atomic operation.

    ``tests/runtime/test_assistant_store.py`` is the conformance suite every implementation passes.
    """

    async def setup(self) -> None:
        """Create or migrate the schema. Idempotent."""

    async def close(self) -> None:
        """Release connections."""

    @abstractmethod
    async def create(self, assistant: Assistant, if_exists: IfExists = "raise") -> Assistant:
        """Insert ``assistant`` as version 1 (its ``version`` is ignored).

        An existing id raises ``AssistantExists`` (``raise``) or is returned unchanged
        (``do_nothing``).
        """

    @abstractmethod
    async def get(self, assistant_id: str) -> Assistant | None: ...

    @abstractmethod
    async def update(self, assistant_id: str, patch: AssistantPatch) -> Assistant | None:
        """Write a new version (highest existing + 1) and make it current; None if missing."""

    @abstractmethod
    async def delete(self, assistant_id: str) -> bool:
        """Delete the assistant and all of its versions."""

    @abstractmethod
    async def search(self, query: AssistantQuery) -> tuple[list[Assistant], int]:
        """One page of matches, and how many match in total."""

    @abstractmethod
    async def count(self, query: AssistantQuery) -> int: ...

    @abstractmethod
    async def versions(
        self, assistant_id: str, metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0
    ) -> list[Assistant]:
        """Stored versions, newest first (``updated_at`` is when that version was written)."""

    @abstractmethod
    async def set_latest(self, assistant_id: str, version: int) -> Assistant | None:
        """Make a stored version current again; None if the assistant or the version is missing."""


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


class AssistantTarget(NamedTuple):
    """What a run needs from an assistant (``resolve_assistant``)."""

    graph_id: str  # the configured assistant or graph the harness builds
    config: dict[str, Any]
    context: dict[str, Any]
    assistant_id: str  # the assistant's UUID


async def resolve_assistant(runtime: Runtime, assistant_id: str) -> AssistantTarget:
    """Resolve a run's ``assistant_id``: a configured name, a system UUID or a user assistant.

    Raises ``RequestError`` (404) naming ``assistant_id`` when it is unknown, or when its graph is
    not configured in this process.
    """
    known = runtime.harness.assistant_ids
    found = await runtime.assistants.get(assistant_key(assistant_id))
    if found is None:
        raise RequestError(
            "assistant_id", f"assistant {assistant_id!r} not found; configured: {known}", status=404
        )
    if found.graph_id not in known:
        raise RequestError(
            "assistant_id",
            f"assistant {assistant_id!r} uses graph {found.graph_id!r}, which is not configured "
            f"(configured: {known})",
            status=404,
        )
    return AssistantTarget(found.graph_id, found.config, found.context, found.assistant_id)


async def ensure_system_assistants(store: AssistantStore, names: list[str]) -> None:
    """Create the system assistant of every configured name that does not have one yet.

    Existing ones are kept as they are (a PATCH survives restarts), and system assistants of names
    no longer configured are not deleted: processes of a rolling deploy may still serve them.
    """
    for name in names:
        await store.create(
            Assistant(
                assistant_id=system_assistant_id(name),
                graph_id=name,
                metadata=dict(SYSTEM_METADATA),
                name=name,
            ),
            if_exists="do_nothing",
        )
