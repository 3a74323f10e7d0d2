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

from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.middleware.base import KeelMiddleware, ToolHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import TOOL_META
from agentkeel.harness.middleware.responses import map_tool_messages
from agentkeel.harness.middleware.sanitize import neutralize_content
from agentkeel.limits import SanitizationLimits


class ToolResultSanitization(KeelMiddleware):
    """Escapes framework-authority tags in the results of every non-exempt tool."""

    # Requiring the metadata puts it outer of ToolErrorHandling, so the error text built from a
    # tool's exception (which can quote attacker-controlled output) is neutralised too.
    contract: ClassVar[Contract] = Contract(
        axes={"tool": on(requires={"tool_result.meta"}, reads={"tool_result.meta"}, mutates={"tool_result"})}
    )

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
        statuses: list[str] = []

        def clean(message: ToolMessage) -> ToolMessage:
            content = neutralize_content(message.content)
            if content == message.content:
                return message
            changed.append(str(message.tool_call_id))
            statuses.append(str((message.additional_kwargs.get(TOOL_META) or {}).get("status", "unknown")))
            return message.model_copy(update={"content": content})

        cleaned = map_tool_messages(result, clean)
        if changed:
            self.intervene(
                request.runtime, "neutralized",
                f"escaped framework-authority tags in the result of {tool}",
                tool=tool, tool_call_ids=changed, result_statuses=statuses,
            )
        return cleaned


__all__ = ["ToolResultSanitization"]
