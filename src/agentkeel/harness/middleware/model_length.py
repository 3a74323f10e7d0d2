"""Output cut at the model's length limit: a truncated tool call must never execute.

When a response hits the provider's output-token limit, whatever was being generated last is cut
mid-way — very often the arguments of a tool call (a long ``write_file`` content). DeerFlow let such
calls run, writing half a file, or fail JSON parsing far from the cause. Here every length stop is
recorded as ``model_length_capped``; tool calls in such a response are suppressed (a protocol
repair, not counted as intent) and the model is told to split the work into smaller pieces.
"""

from __future__ import annotations

from agentkeel.harness.middleware.finish_reasons import Detection, Detector, FinishReasonGuard

LENGTH_DETECTORS: tuple[Detector, ...] = (
    Detector("openai_length", "finish_reason", frozenset({"length"})),
    Detector("anthropic_max_tokens", "stop_reason", frozenset({"max_tokens"})),
    Detector("gemini_max_tokens", "finish_reason", frozenset({"max_tokens"})),
)


class ModelLengthFinishReason(FinishReasonGuard):
    """Record every output-length stop and suppress the (possibly cut) tool calls it carries."""

    detectors = LENGTH_DETECTORS
    code = "model_length_capped"

    def situation(self, found: Detection) -> str:
        return f"the model's output was cut at its length limit ({found.field}={found.value})"

    def note(self, found: Detection, names: list[str]) -> str:
        return (
            f"[Your output was cut at the output-length limit ({found.field}={found.value}), so "
            f"these tool calls were not executed: {', '.join(names)}. Split the work into smaller "
            "pieces (for example, write a long file in several shorter steps).]"
        )


__all__ = ["LENGTH_DETECTORS", "ModelLengthFinishReason"]
