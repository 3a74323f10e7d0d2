"""System assistants, and how a run's ``assistant_id`` resolves to what the harness builds.

Every configured assistant (``assistants:``) and graph (``graphs:``) has a *system* assistant whose
id is ``system_assistant_id(name)``. System assistants are written to the store at start-up
(``ensure_system_assistants``) instead of being synthesised on every read: search, count, sorting
and pagination then treat system and user assistants alike, in the database.

A configured name is also accepted wherever an assistant id is (``assistant_key`` maps it to the
system id), which is how run payloads name assistants in practice.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from agentkeel.runtime.requests import RequestError
from agentkeel.runtime.stores.assistants import (
    Assistant,
    AssistantStore,
    system_assistant_id,
)

if TYPE_CHECKING:
    from agentkeel.runtime.runtime import Runtime

SYSTEM_METADATA = {"created_by": "system"}


def assistant_key(assistant_id: str) -> str:
    """The stored id an assistant reference means: a UUID as itself, anything else as a name."""
    try:
        return str(uuid.UUID(assistant_id))
    except ValueError:
        return system_assistant_id(assistant_id)


class AssistantTarget(NamedTuple):
    """What a run needs from an assistant (``resolve_assistant``)."""

    graph_id: str  # the configured assistant or graph the harness builds
    config: dict[str, Any]
    context: dict[str, Any]
    assistant_id: str  # the assistant's UUID


async def resolve_assistant(
    runtime: Runtime, assistant_id: str, visible: Callable[[Assistant], bool] | None = None
) -> AssistantTarget:
    """Resolve a run's ``assistant_id``: a configured name, a system UUID or a user assistant.

    Raises ``RequestError`` (404) naming ``assistant_id`` when it is unknown, not ``visible`` to
    the caller (the same answer: another user's assistant is not found), or when its graph is not
    configured in this process.
    """
    known = runtime.harness.assistant_ids
    found = await runtime.assistants.get(assistant_key(assistant_id))
    if found is None or visible is not None and not visible(found):
        raise RequestError(
            "assistant_id", f"assistant {assistant_id!r} not found; configured: {known}", problem="not_found"
        )
    if found.graph_id not in known:
        raise RequestError(
            "assistant_id",
            f"assistant {assistant_id!r} uses graph {found.graph_id!r}, which is not configured "
            f"(configured: {known})",
            problem="not_found",
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
