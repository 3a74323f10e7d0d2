"""The assistant store: assistants (versioned configurations of a graph) and its interface.

An assistant's id is a UUID. The *system* assistant of a configured name has the id
``uuid5(SYSTEM_NAMESPACE, name)`` -- the id the official server gives it, so clients that computed
it themselves keep working (``runtime/assistants.py`` writes them at start-up).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from agentkeel.runtime.records import ConflictError, utcnow

SYSTEM_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
SORT_FIELDS = ("assistant_id", "graph_id", "name", "created_at", "updated_at")
IfExists = Literal["raise", "do_nothing"]


class AssistantExists(ConflictError):
    """``create`` with ``if_exists="raise"`` met an existing id."""


def system_assistant_id(name: str) -> str:
    return str(uuid.uuid5(SYSTEM_NAMESPACE, name))


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
    case-insensitive substring; ``visible_to`` is the gateway's ownership rule."""

    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    # Only assistants whose metadata ``owner`` is this, or that have no ``owner`` (shared ones:
    # system assistants, those made without authentication). None: every assistant.
    visible_to: str | None = None
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


OWNER_KEY = "owner"


def visible_to(assistant: Assistant, user: str | None) -> bool:
    """``AssistantQuery.visible_to`` for one assistant."""
    return user is None or assistant.metadata.get(OWNER_KEY, user) == user


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
