"""Listing a thread's checkpoints by their metadata alone.

Why: the timeline (``runtime/timeline.py``) needs, per checkpoint, only its id and metadata (the
run coordinate stamped into it), but LangGraph's ``alist`` deserialises every checkpoint whole --
in ``full`` mode every message of the thread, again for each checkpoint -- so the first read of a
long run's timeline was quadratic in its length (2.3 s for a 200-turn run). The two database
savers answer from the metadata column instead; any other saver (``InMemorySaver``) goes through
``alist``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

from agentkeel.runtime.checkpoints.accessor import checkpoint_config


class CheckpointHead(NamedTuple):
    checkpoint_id: str
    checkpoint_ns: str
    metadata: dict[str, Any]


@runtime_checkable
class ListsMetadata(Protocol):
    """A saver that can list a thread's root checkpoints without reading their state."""

    def alist_metadata(self, thread_id: str) -> AsyncIterator[CheckpointHead]: ...


async def checkpoint_heads(saver: Any, thread_id: str) -> AsyncGenerator[CheckpointHead, None]:
    """The thread's checkpoints in the root namespace, newest first, as id and metadata."""
    if isinstance(saver, ListsMetadata):
        async for head in saver.alist_metadata(thread_id):
            yield head
        return
    async for tup in saver.alist(checkpoint_config(thread_id)):
        configurable = tup.config["configurable"]
        yield CheckpointHead(
            str(configurable.get("checkpoint_id")), str(configurable.get("checkpoint_ns") or ""),
            dict(tup.metadata or {}),
        )


__all__ = ["CheckpointHead", "ListsMetadata", "checkpoint_heads"]
