"""Asking the user: pause the run on ``ask_clarification`` and resume it with the answer.

Two things go wrong with a clarification question otherwise. Calls the model sent alongside the
question run in the same step — so a file gets written before the user said what they wanted.
And DeerFlow ended the whole run to ask (``goto=END``), so the answer arrived as a new run that
had to rebuild everything. Here the model axis keeps only the question when a response mixes it
with other calls (a protocol repair: the siblings were premature, not intent), and the tool axis
pauses the run with a LangGraph ``interrupt``: the thread is checkpointed where it paused,
``clarification_requested`` is recorded, and a run with ``command.resume`` continues the thread from
that point, the call answered by a ``ToolMessage`` carrying the user's answer.
"""

from __future__ import annotations

from typing import Any, ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler, ToolHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import last_ai, replace_ai, suppress

TOOL_NAME = "ask_clarification"
SIBLINGS_NOTE = (
    "[Only the clarification question was kept; the other tool calls in this response were not "
    "executed. Wait for the answer, then call them again if they still apply.]"
)


def normalize_options(raw: Any) -> list[str] | None:
    """The suggested answers as a list of strings (a single string counts as one option)."""
    if isinstance(raw, str):
        return [raw] if raw.strip() else None
    if isinstance(raw, list | tuple):
        return [str(option) for option in raw] or None
    return None


class Clarification(KeelMiddleware):
    """Keep a clarification question alone in its response, and ask it through an interrupt."""

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(mutates={"model_response.tool_calls"}), "tool": on(mutates={"tool_result"})},
        mandatory_for=frozenset({"lead"}),
    )

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        response = await handler(request)
        ai = last_ai(response)
        if ai is None or len(ai.tool_calls) < 2:
            return response
        question = next((c for c in ai.tool_calls if c.get("name") == TOOL_NAME), None)
        if question is None:
            return response
        dropped = [{"name": c.get("name"), "id": c.get("id")} for c in ai.tool_calls if c is not question]
        self.intervene(
            request.runtime, "suppress_tool_calls", "tool calls sent alongside a clarification question",
            message_id=ai.id, kept=question.get("id"), tool_calls=dropped,
        )
        return replace_ai(response, ai, suppress(ai, self.name, SIBLINGS_NOTE, keep=[question]))

    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolMessage | Command[Any]:
        call = request.tool_call
        if call.get("name") != TOOL_NAME:
            return await handler(request)
        args = call.get("args") or {}
        question = args.get("question")
        call_id = str(call.get("id"))
        if not isinstance(question, str) or not question.strip():
            return ToolMessage(
                content="ask_clarification needs a non-empty `question`; nothing was asked.",
                name=TOOL_NAME, tool_call_id=call_id, status="error",
            )
        payload = {
            "type": "clarification", "question": question,
            "options": normalize_options(args.get("options")), "tool_call_id": call_id,
        }
        try:
            answer = interrupt(payload)
        except GraphInterrupt:
            await self.stop(
                request.runtime, "clarification_requested", f"asked the user: {question}",
                data={"question": question}, cause=call_id,
            )
            self.intervene(request.runtime, "ask_user", "run paused for a clarification", tool_call_id=call_id)
            raise
        return ToolMessage(content=f"The user answered: {answer}", name=TOOL_NAME, tool_call_id=call_id)


__all__ = ["TOOL_NAME", "Clarification", "normalize_options"]
