"""The user's message reaches the model fenced and with its authority tags escaped.

A user (or whoever controls the text a client forwards) can type ``<system-reminder>`` and be read
as the framework. Before every model call, the last genuine user message of the request is
neutralised and wrapped in ``--- BEGIN USER INPUT ---`` / ``--- END USER INPUT ---``
(:mod:`~agentkeel.harness.middleware.sanitize`).

Why on the request only: graph state keeps what the user actually wrote, so the transcript, the
UI and later runs see the original; every request is derived from it again, and the transform is
idempotent, so the history the provider sees is stable from call to call (prompt caching holds).

Why outermost: it must see the message as the client sent it, before any framework injection
(hints, durable context) that it must not escape.

Why fail-open: escaping is a hardening layer, not an access control. A bug in it must not take
the whole agent down; the original request is sent and the failure is journaled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import BaseMessage, HumanMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import is_hint, text_of
from agentkeel.harness.middleware.sanitize import wrap_content

SUMMARY_NAME = "summary"
"""``HumanMessage.name`` of a compaction summary: framework text, not the user's."""


def last_user_index(messages: Sequence[BaseMessage]) -> int | None:
    """Index of the last genuine user message: a HumanMessage that is neither a transient hint
    nor a compaction summary."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage) and not is_hint(message) and message.name != SUMMARY_NAME:
            return index
    return None


def sanitized_request(request: ModelRequest) -> ModelRequest:
    """``request`` with its last genuine user message neutralised and fenced (same id, name and
    metadata); ``request`` itself when there is nothing to change."""
    index = last_user_index(request.messages)
    if index is None:
        return request
    message = request.messages[index]
    if not text_of(message).strip():
        return request
    content = wrap_content(message.content)
    if content == message.content:
        return request
    messages = list(request.messages)
    messages[index] = message.model_copy(update={"content": content})
    return request.override(messages=messages)


class InputSanitization(KeelMiddleware):
    """Neutralises and fences the user's last message in every model request (never in state)."""

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(mutates={"model_request.messages"}, slot="outermost")},
    )

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        try:
            outgoing = sanitized_request(request)
        except Exception as exc:  # fail-open: see the module docstring
            self.intervene(
                request.runtime, "fail_open",
                "input sanitization failed; the user's message was sent unchanged",
                error=f"{type(exc).__name__}: {exc}",
            )
            outgoing = request
        return await handler(outgoing)


__all__ = ["InputSanitization", "SUMMARY_NAME", "last_user_index", "sanitized_request"]
