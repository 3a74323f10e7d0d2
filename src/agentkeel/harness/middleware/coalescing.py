"""SystemMessageCoalescing: exactly one leading system message reaches the provider.

Why: strict providers accept one system prompt, first (Anthropic takes it as a separate field and
rejects any other; several OpenAI-compatible servers answer a second one with HTTP 400). Yet a
request legitimately gathers several: the agent's own prompt, the system messages of a thread's
compacted part (kept, never summarised away) and the rules the runtime owns for a compacted
thread (:mod:`agentkeel.harness.projection`). DeerFlow fixed an assistant-first history after
compaction and then shipped a duplicate system message; the merge belongs in one place, inner of
every producer, instead of in each of them.

What: the request's ``system_message`` (the agent's own prompt) first, then every SystemMessage
found in the messages in order, joined by a blank line into the one ``system_message``; they leave
the message list. Text blocks are joined, other blocks (and text blocks carrying more than text,
such as cache markers) are kept as blocks. A request with no SystemMessage among its messages is
passed through untouched, so the agent's prompt prefix stays byte-identical and cacheable.

Contract: it ``requires`` the fact ``system_authority_message`` on the model axis, which every
producer of a system message provides (DurableContext), so the builder puts it inner of all of
them; RequestGrammar observes the final system prompt, so it stays outer of that last check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, cast

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AnyMessage, BaseMessage, SystemMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.repair import merge_system_messages

SYSTEM_AUTHORITY = "system_authority_message"
"""The fact a middleware provides on the model axis when it puts a SystemMessage in the messages."""


def coalesce(
    system_message: SystemMessage | None, messages: Sequence[BaseMessage]
) -> tuple[SystemMessage | None, list[BaseMessage]]:
    """``(system_message, messages)`` with every SystemMessage of ``messages`` folded into the one
    system prompt, the given one first; unchanged (the same list) when there is none."""
    if system_message is None and messages and isinstance(messages[0], SystemMessage):
        system_message, messages = messages[0], messages[1:]
    system, rest, _ = merge_system_messages(system_message, messages)
    return system, rest


class SystemMessageCoalescing(KeelMiddleware):
    """Merges every system message of a request into its one leading system prompt."""

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(
            requires={SYSTEM_AUTHORITY},
            mutates={"model_request.system", "model_request.messages"},
        )},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        if not any(isinstance(m, SystemMessage) for m in request.messages):
            return await handler(request)
        system, rest = coalesce(request.system_message, request.messages)
        return await handler(request.override(system_message=system, messages=cast(list[AnyMessage], rest)))


__all__ = ["SYSTEM_AUTHORITY", "SystemMessageCoalescing", "coalesce"]
