"""Provider safety stops: a response the provider cut for safety must not act on the world.

When a provider stops generation for safety (OpenAI-style ``content_filter``, Anthropic
``refusal``, Gemini ``SAFETY`` and friends) the text ends where the filter struck, and any tool call
in the response may carry arguments cut off at that point: writing that file or running that
command would act on a half-formed intent. DeerFlow only handled the case with tool calls and left a
refusal without them looking like a clean success; here every safety stop is recorded as
``safety_capped``, and tool calls in such a response are suppressed (a protocol repair, never
counted as the model's intent by loop or budget guards).

The detectors are shared with :mod:`agentkeel.harness.middleware.model_length`: each reads one
string field, from ``response_metadata`` first and then ``additional_kwargs``, case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import last_ai, replace_ai, suppress

SAFETY_STAMP = "agentkeel_safety"
"""On the rewritten AIMessage's ``additional_kwargs``: what stopped it and which calls were dropped."""


@dataclass(frozen=True)
class Detection:
    detector: str
    field: str
    value: str


@dataclass(frozen=True)
class Detector:
    """A provider finish signal: ``field`` holding one of ``values`` (compared case-insensitively)."""

    name: str
    field: str
    values: frozenset[str]

    def match(self, message: AIMessage) -> Detection | None:
        value = finish_value(message, self.field)
        if value is not None and value.lower() in self.values:
            return Detection(self.name, self.field, value)
        return None


def _lowered(*values: str) -> frozenset[str]:
    return frozenset(v.lower() for v in values)


SAFETY_DETECTORS: tuple[Detector, ...] = (
    Detector("openai_content_filter", "finish_reason", _lowered("content_filter")),
    Detector("anthropic_refusal", "stop_reason", _lowered("refusal")),
    # MAX_TOKENS, OTHER and MALFORMED_FUNCTION_CALL are not safety stops.
    Detector(
        "gemini_safety",
        "finish_reason",
        _lowered(
            "SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "RECITATION",
            "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
        ),
    ),
)


def finish_value(message: AIMessage, field: str) -> str | None:
    """The string value of ``field`` in ``response_metadata``, else in ``additional_kwargs``."""
    for source in (message.response_metadata, message.additional_kwargs):
        value = (source or {}).get(field)
        if isinstance(value, str):
            return value
    return None


def detect(message: AIMessage, detectors: tuple[Detector, ...]) -> Detection | None:
    """The first detector (in order) that matches ``message``."""
    for detector in detectors:
        found = detector.match(message)
        if found is not None:
            return found
    return None


def call_refs(message: AIMessage) -> list[dict[str, Any]]:
    """Names and ids of the message's tool calls: what may be logged (never the arguments)."""
    return [{"name": c.get("name"), "id": c.get("id")} for c in message.tool_calls]


class SafetyFinishReason(KeelMiddleware):
    """Record every provider safety stop and suppress the tool calls of such a response."""

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
        found = detect(ai, SAFETY_DETECTORS)
        if found is None:
            return response
        runtime = request.runtime
        refs = call_refs(ai)
        names = [str(r["name"]) for r in refs]
        stamp = {
            "detector": found.detector, "field": found.field, "value": found.value,
            "suppressed_tool_calls": names,
        }
        rewritten = ai
        if refs:
            rewritten = suppress(
                ai, self.name,
                f"[The provider stopped this response for safety reasons ({found.field}={found.value}); "
                f"its tool calls ({', '.join(names)}) were not executed because their arguments may be "
                "cut off.]",
            )
            self.intervene(
                runtime, "suppress_tool_calls",
                f"provider safety stop ({found.field}={found.value})",
                message_id=ai.id, tool_calls=refs,
            )
        rewritten = rewritten.model_copy(
            update={"additional_kwargs": {**rewritten.additional_kwargs, SAFETY_STAMP: stamp}}
        )
        await self.stop(
            runtime, "safety_capped",
            f"the provider stopped the response for safety ({found.field}={found.value})"
            + (f"; suppressed tool calls: {', '.join(names)}" if names else ""),
            data={"field": found.field, "value": found.value, "suppressed": names},
            cause=ai.id,
        )
        return replace_ai(response, ai, rewritten)


__all__ = [
    "SAFETY_DETECTORS",
    "SAFETY_STAMP",
    "Detection",
    "Detector",
    "SafetyFinishReason",
    "call_refs",
    "detect",
    "finish_value",
]
