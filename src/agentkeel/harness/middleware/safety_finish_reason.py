"""Provider safety stops: a response the provider cut for safety must not act on the world.

When a provider stops generation for safety (OpenAI-style ``content_filter``, Anthropic
``refusal``, Gemini ``SAFETY`` and friends) the text ends where the filter struck, and any tool call
in the response may carry arguments cut off at that point: writing that file or running that
command would act on a half-formed intent. DeerFlow only handled the case with tool calls and left a
refusal without them looking like a clean success; here every safety stop is recorded as
``safety_capped``, and tool calls in such a response are suppressed (a protocol repair, never
counted as the model's intent by loop or budget guards).

Each detector reads one string field, from ``response_metadata`` first and then
``additional_kwargs``, case-insensitively (:mod:`.finish_reasons`).
"""

from __future__ import annotations

from agentkeel.harness.middleware.finish_reasons import (
    Detection,
    Detector,
    FinishReasonGuard,
    detect,
    lowered,
)

SAFETY_STAMP = "agentkeel_safety"
"""On the rewritten AIMessage's ``additional_kwargs``: what stopped it and which calls were dropped."""

SAFETY_DETECTORS: tuple[Detector, ...] = (
    Detector("openai_content_filter", "finish_reason", lowered("content_filter")),
    Detector("anthropic_refusal", "stop_reason", lowered("refusal")),
    # MAX_TOKENS, OTHER and MALFORMED_FUNCTION_CALL are not safety stops.
    Detector(
        "gemini_safety",
        "finish_reason",
        lowered(
            "SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "RECITATION",
            "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
        ),
    ),
)


class SafetyFinishReason(FinishReasonGuard):
    """Record every provider safety stop and suppress the tool calls of such a response."""

    detectors = SAFETY_DETECTORS
    code = "safety_capped"
    stamp_key = SAFETY_STAMP

    def situation(self, found: Detection) -> str:
        return f"the provider stopped the response for safety ({found.field}={found.value})"

    def note(self, found: Detection, names: list[str]) -> str:
        return (
            f"[The provider stopped this response for safety reasons ({found.field}={found.value}); "
            f"its tool calls ({', '.join(names)}) were not executed because their arguments may be "
            "cut off.]"
        )


__all__ = ["SAFETY_DETECTORS", "SAFETY_STAMP", "SafetyFinishReason", "detect"]
