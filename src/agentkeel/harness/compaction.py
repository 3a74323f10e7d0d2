"""Where a compaction cuts the thread, and where the part the model is still sent begins.

Compaction in AgentKeel is a projection: the thread keeps every message (state, history and the UI
show the whole conversation) and only what the *model is sent* changes — the summary and durable
context instead of ``messages[:cut]``, then ``messages[cut:]`` verbatim (the kept tail). This module
holds the two rules about the cut, as pure functions so every reader applies the same ones:

* :func:`choose_cut` — the kept tail never starts with a tool result (which would orphan it from
  its assistant tool-call message), so a cut landing inside a tool batch moves back to the
  assistant message; and a cut only ever moves forward.
* :func:`kept_from` — the index of the first message of the kept tail for a stored compaction, or
  0 when the stored compaction no longer fits the thread (its last compacted message is not where
  it was: an edit removed or replaced messages). Then nothing is left out; the next compaction
  starts a new generation (:func:`agentkeel.harness.durable.merge_compaction`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from agentkeel.harness.durable import Compaction


def _fits(messages: Sequence[BaseMessage], cut: int, through_id: str | None) -> bool:
    return 0 < cut <= len(messages) and through_id is not None and messages[cut - 1].id == through_id


def kept_from(messages: Sequence[BaseMessage], compaction: Compaction | None) -> int:
    """The index of the first kept message under ``compaction`` (0: nothing compacted)."""
    if not compaction:
        return 0
    cut = int(compaction.get("compacted") or 0)
    return cut if _fits(messages, cut, compaction.get("through_id")) else 0


def fits(messages: Sequence[BaseMessage], compaction: Compaction | None) -> bool:
    """Whether ``compaction`` describes a prefix of ``messages`` (a new cut keeps its generation)."""
    return bool(compaction) and kept_from(messages, compaction) > 0


def choose_cut(messages: Sequence[BaseMessage], keep: int, start: int = 0) -> int | None:
    """The cut that keeps about the last ``keep`` messages, or None when it would not move past
    ``start`` (the current cut): nothing new to compact.

    The kept tail never begins with a ToolMessage: the cut moves back to the assistant message
    whose calls those results answer, so a tool batch stays whole (the tail may then be longer
    than ``keep``). System messages in the compacted part are still sent: the projection
    (:mod:`agentkeel.harness.projection`) keeps them, as it keeps the latest user request.
    """
    cut = max(len(messages) - max(keep, 0), 0)
    while 0 < cut < len(messages) and isinstance(messages[cut], ToolMessage):
        cut -= 1
    return cut if cut > start else None


def latest_user_message(messages: Sequence[BaseMessage]) -> BaseMessage | None:
    """The newest genuine user message (not a framework hint or data message)."""
    from agentkeel.harness.middleware.input_sanitization import is_user_input

    for message in reversed(messages):
        if isinstance(message, HumanMessage) and is_user_input(message):
            return message
    return None


def new_compaction(
    messages: Sequence[BaseMessage], cut: int, summary: str, current: Compaction | None, *,
    model: str | None, at: str,
) -> Compaction:
    """The record of a compaction of ``messages[:cut]``: same generation while the current one
    still fits the thread, the next one otherwise."""
    generation = int((current or {}).get("generation") or 0)
    if current and not fits(messages, current):
        generation += 1
    through = messages[cut - 1].id
    if not through:
        raise ValueError("compaction: the last compacted message has no id")
    return {"summary": summary, "compacted": cut, "through_id": through, "generation": generation,
            "model": model, "at": at}


def message_ids(messages: Sequence[Any]) -> set[str]:
    return {m.id for m in messages if getattr(m, "id", None)}


__all__ = ["choose_cut", "fits", "kept_from", "latest_user_message", "message_ids", "new_compaction"]
