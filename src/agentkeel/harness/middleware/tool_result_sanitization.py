"""Tool output cannot pose as the framework: authority tags in results are escaped.

A fetched page, a command's output or a subagent's answer is text an outsider may control, and a
``<system-reminder>`` in it is read as the framework speaking (injection through tool output). Each
result is neutralised (:func:`~agentkeel.harness.middleware.sanitize.neutralize_content`, no fence)
before any other guard or the model sees it.

Why every tool by default and an exempt list, rather than a list of "web" tools: an allow-list
by name silently misses every new fetcher (an MCP tool, a plugin) — the safe default is to cover
all. The workspace file tools are exempt because they show the user's own files verbatim; escaped
text there would be copied into ``str_replace`` and miss.

Why on the result (state, not just the request): the escaped text is what the model reasoned
about, and what later guards fingerprint; it must be the same text every time it is replayed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.middleware.base import KeelMiddleware
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.sanitize import map_tool_messages, neutralize_content
from agentkeel.limits import SanitizationLimits

ToolHandler = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]


class ToolResultSanitization(KeelMiddleware):
    """Escapes framework-authority tags in the results of every non-exempt tool."""

    contract: ClassVar[Contract] = Contract(axes={"tool": on(mutates={"tool_result"})})

    def __init__(self, limits: SanitizationLimits) -> None:
        super().__init__()
        self.limits = limits
        self._exempt = frozenset(limits.exempt_tools)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolMessage | Command[Any]:
        result = await handler(request)
        tool = str(request.tool_call.get("name", ""))
        if not self.limits.enabled or tool in self._exempt:
            return result
        changed: list[str] = []

        def clean(message: ToolMessage) -> ToolMessage:
            content = neutralize_content(message.content)
            if content == message.content:
                return message
            changed.append(str(message.tool_call_id))
            return message.model_copy(update={"content": content})

        cleaned = map_tool_messages(result, clean)
        if changed:
            self.intervene(
                request.runtime, "neutralized",
                f"escaped framework-authority tags in the result of {tool}",
                tool=tool, tool_call_ids=changed,
            )
        return cleaned


__all__ = ["ToolResultSanitization"]
