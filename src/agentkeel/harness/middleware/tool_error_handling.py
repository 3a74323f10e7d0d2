"""Every tool call ends in a ToolMessage the model can read, with a verdict guards can trust.

Two jobs, both at the innermost edge of the tool axis:

* A tool that raises must not end the run: the model asked for the call and is owed an answer, and
  an unanswered call id would break the next request. The exception becomes an error ToolMessage
  that names the tool and the failure and tells the model how to go on. Graph control flow
  (``GraphBubbleUp``: interrupts, parent commands) is not an error and always propagates, nor is a
  re-run's ``ToolReplayMiss`` (the call is not the recorded one: the run must fail on it), and
  cancellation (``CancelledError`` is not an ``Exception``) is never caught.
* Every ToolMessage result — also those inside a ``Command`` update — is classified once
  (:func:`~agentkeel.harness.middleware.tool_meta.classify`) and stamped under ``TOOL_META``, the
  fact ToolProgress and the reports read. A result that already carries a stamp was produced by a
  guard on purpose and keeps its own.

Messages are copied, never rebuilt, so ids, artifacts and other metadata survive.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest

from agentkeel.harness.middleware.base import KeelMiddleware, ToolHandler, ToolResult
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import TOOL_META
from agentkeel.harness.middleware.responses import map_tool_messages
from agentkeel.harness.middleware.tool_meta import classify
from agentkeel.harness.tool_replay import ToolReplayMiss

DETAIL_MAX_CHARS = 500


def _detail(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or repr(exc)
    return text if len(text) <= DETAIL_MAX_CHARS else text[: DETAIL_MAX_CHARS - 1] + "…"


def exception_message(name: str, tool_call_id: str, exc: Exception) -> ToolMessage:
    """The error ToolMessage that answers a call whose tool raised ``exc``, stamped."""
    message = ToolMessage(
        content=(
            f"Error: tool {name} failed with {type(exc).__name__}: {_detail(exc)}. "
            "Continue with the context you have, or choose another tool."
        ),
        name=name,
        tool_call_id=tool_call_id,
        status="error",
    )
    meta = classify(message, "exception", error_type=type(exc).__name__)
    return message.model_copy(update={"additional_kwargs": {TOOL_META: meta}})


def stamp(message: ToolMessage) -> ToolMessage:
    """``message`` with a ``TOOL_META`` verdict of source ``tool``, unless it has one already."""
    if TOOL_META in message.additional_kwargs:
        return message
    kwargs = {**message.additional_kwargs, TOOL_META: classify(message, "tool")}
    return message.model_copy(update={"additional_kwargs": kwargs})


def stamp_result(result: Any) -> Any:
    """Stamp a ToolMessage, or the ToolMessages of a ``Command``'s ``messages`` update."""
    return map_tool_messages(result, stamp)


class ToolErrorHandling(KeelMiddleware):
    """Turns tool exceptions into error results and stamps every result's ``TOOL_META``."""

    contract = Contract(
        axes={"tool": on(provides={"tool_result.meta"}, mutates={"tool_result"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolResult:
        call = request.tool_call
        try:
            result = await handler(request)
        except (GraphBubbleUp, ToolReplayMiss):
            raise
        except Exception as exc:
            name = str(call.get("name") or "unknown")
            self.intervene(
                request.runtime, "tool_exception", f"tool {name} raised {type(exc).__name__}",
                tool=name, tool_call_id=call.get("id"), error_type=type(exc).__name__,
            )
            return exception_message(name, str(call.get("id") or ""), exc)
        return stamp_result(result)


__all__ = ["DETAIL_MAX_CHARS", "ToolErrorHandling", "exception_message", "stamp", "stamp_result"]
