"""Every run ends with an answer: one extra, tool-less model call when the last response has none.

Two situations leave a run without a final answer. A guard or a repair took the response's tool
calls away (loop, budget, turn limit, safety, length): the run would end on a message that only says
"your calls were not executed". Or the model went quiet after tool work: no text, no calls. Both
look like success to the caller while delivering nothing.

DeerFlow repaired only the empty case, by deleting the message and jumping back to the model node
(an extra graph step, a second retry budget keyed by thread and run, and state churn). Here the
repair happens inside the same model call: exactly one extra provider call, with no tools bound and
a transient instruction to answer now from what the agent already has. Both responses are kept in
state (the stripped one documents what was not executed); the instruction is not. An instance lives
for one run, so "at most one extra call per run" is plain instance state.

This wrapper must see the final tool calls and dispatch decision of every other guard, so its
contract ``observes_final`` them and the chain builder places it outside all of their mutators;
the extra call therefore runs through those guards again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import (
    hint_message,
    is_hint,
    last_ai,
    replace_ai,
    suppress,
    text_of,
    was_stripped,
)
from agentkeel.harness.scripted.strict import is_empty_assistant

INSTRUCTION_NAME = "terminal_instruction"
INSTRUCTION = (
    "Tools are no longer available. Give your final answer to the user now, based on what you have "
    "already done and found. Do not call any tool; say plainly what is incomplete or uncertain."
)
LATE_CALLS_NOTE = "[Tool calls made after the final-answer instruction were not executed.]"


def tool_work_since_user(messages: Sequence[BaseMessage]) -> bool:
    """Whether a tool result follows the latest genuine (non-hint) user message."""
    for message in reversed(messages):
        if isinstance(message, ToolMessage):
            return True
        if isinstance(message, HumanMessage) and not is_hint(message):
            return False
    return False


def final_answer_missing(ai: AIMessage, history: Sequence[BaseMessage]) -> str | None:
    """Why ``ai`` leaves the run without an answer (``stripped`` / ``empty``), or None if it does not."""
    if ai.tool_calls:
        return None
    if was_stripped(ai):
        return "stripped"
    if not text_of(ai).strip() and tool_work_since_user(history):
        return "empty"
    return None


class TerminalResponse(KeelMiddleware):
    """Make one tool-less extra call when a response leaves the run without a final answer."""

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(
            observes_final={"model_response.tool_calls", "model_response.dispatch"},
            mutates={"model_request.tools", "model_request.messages", "model_response.final_answer"},
        )},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self) -> None:
        super().__init__()
        self._extra_call_used = False

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        response = await handler(request)
        ai = last_ai(response)
        if ai is None or self._extra_call_used:
            return response
        why = final_answer_missing(ai, request.messages)
        if why is None:
            return response
        # Marked before the call: a failing extra call is not retried here, and never repeated.
        self._extra_call_used = True
        # An empty reply is left out of the extra request: it says nothing, and strict providers
        # reject an assistant message with neither content nor tool calls.
        shown = [] if is_empty_assistant(ai) else [ai]
        final = await handler(request.override(
            messages=[*request.messages, *shown, hint_message(INSTRUCTION_NAME, [INSTRUCTION])], tools=[],
        ))
        final_ai = last_ai(final)
        if final_ai is None:
            return response
        late = [str(c.get("name")) for c in final_ai.tool_calls]
        if late:
            final = replace_ai(final, final_ai, suppress(final_ai, self.name, LATE_CALLS_NOTE))
        self.intervene(
            request.runtime, "final_answer",
            f"one tool-less call for a final answer (previous response {why})",
            message_id=ai.id, final_message_id=final_ai.id, trigger=why, suppressed_tool_calls=late,
        )
        return ModelResponse(result=[*response.result, *final.result], structured_response=final.structured_response)


__all__ = ["INSTRUCTION", "INSTRUCTION_NAME", "TerminalResponse", "final_answer_missing", "tool_work_since_user"]
