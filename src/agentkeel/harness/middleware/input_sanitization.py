"""The user's message reaches the model fenced and with its authority tags escaped.

A user (or whoever controls the text a client forwards) can type ``<system-reminder>`` and be read
as the framework. Before every model call, every genuine user message of the request is
neutralised and wrapped in ``--- BEGIN USER INPUT ---`` / ``--- END USER INPUT ---``
(:mod:`~agentkeel.harness.middleware.sanitize`).

Why every one, not only the last: a message is sent the same way in every request and every run.
Fencing only the latest one sent a thread's first message fenced in run 1 and bare in run 2, so the
provider's prompt cache missed on the whole history from that message on, and an old message's
tags were neutralised in one run and live in the next.

Why on the request only: graph state keeps what the user actually wrote, so the transcript, the
UI and later runs see the original; every request is derived from it again, and the transform is
idempotent, so the history the provider sees is byte-identical from call to call and from run to
run (prompt caching holds).

Why outermost: it must see the message as the client sent it, before any framework injection
(hints, durable context) that it must not escape.

Why fail-open: escaping is a hardening layer, not an access control. A bug in it must not take
the whole agent down; the original request is sent and the failure is journaled.
"""

from __future__ import annotations

from typing import ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import BaseMessage, HumanMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import is_hint, text_of
from agentkeel.harness.middleware.sanitize import wrap_content


def is_user_input(message: BaseMessage) -> bool:
    """A genuine user message: a HumanMessage that is not a transient hint. (The durable-context
    data message of a compacted thread is added inner of this guard, so it never sees it; a
    message's name is the client's to choose and never exempts it.)"""
    return isinstance(message, HumanMessage) and not is_hint(message)


def sanitized_request(request: ModelRequest) -> ModelRequest:
    """``request`` with every genuine user message neutralised and fenced (same id, name and
    metadata); ``request`` itself when there is nothing to change."""
    messages = list(request.messages)
    changed = False
    for index, message in enumerate(messages):
        if not is_user_input(message) or not text_of(message).strip():
            continue
        content = wrap_content(message.content)
        if content != message.content:
            messages[index] = message.model_copy(update={"content": content})
            changed = True
    return request.override(messages=messages) if changed else request


class InputSanitization(KeelMiddleware):
    """Neutralises and fences every user message in every model request (never in state)."""

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


__all__ = ["InputSanitization", "is_user_input", "sanitized_request"]
