"""Output cut at the model's length limit: a truncated tool call must never execute.

When a response hits the provider's output-token limit, whatever was being generated last is cut
mid-way — very often the arguments of a tool call (a long ``write_file`` content). DeerFlow let such
calls run, writing half a file, or fail JSON parsing far from the cause. Here every length stop is
recorded as ``model_length_capped``; tool calls in such a response are suppressed (a protocol
repair, not counted as intent) and the model is told to split the work into smaller pieces.
"""

from __future__ import annotations

from typing import ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import last_ai, replace_ai, suppress
from agentkeel.harness.middleware.safety_finish_reason import Detector, call_refs, detect

LENGTH_DETECTORS: tuple[Detector, ...] = (
    Detector("openai_length", "finish_reason", frozenset({"length"})),
    Detector("anthropic_max_tokens", "stop_reason", frozenset({"max_tokens"})),
    Detector("gemini_max_tokens", "finish_reason", frozenset({"max_tokens"})),
)


class ModelLengthFinishReason(KeelMiddleware):
    """Record every output-length stop and suppress the (possibly cut) tool calls it carries."""

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(reads={"model_response.finish_reason"}, mutates={"model_response.tool_calls"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        response = await handler(request)
        ai = last_ai(response)
        if ai is None:
            return response
        found = detect(ai, LENGTH_DETECTORS)
        if found is None:
            return response
        runtime = request.runtime
        refs = call_refs(ai)
        names = [str(r["name"]) for r in refs]
        if refs:
            response = replace_ai(response, ai, suppress(
                ai, self.name,
                f"[Your output was cut at the output-length limit ({found.field}={found.value}), so "
                f"these tool calls were not executed: {', '.join(names)}. Split the work into smaller "
                "pieces (for example, write a long file in several shorter steps).]",
            ))
            self.intervene(
                runtime, "suppress_tool_calls",
                f"output cut at the length limit ({found.field}={found.value})",
                message_id=ai.id, tool_calls=refs,
            )
        await self.stop(
            runtime, "model_length_capped",
            f"the model's output was cut at its length limit ({found.field}={found.value})"
            + (f"; suppressed tool calls: {', '.join(names)}" if names else ""),
            data={"field": found.field, "value": found.value, "suppressed": names},
            cause=ai.id,
        )
        return response


__all__ = ["LENGTH_DETECTORS", "ModelLengthFinishReason"]
