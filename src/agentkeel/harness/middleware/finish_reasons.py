"""What the two finish-reason guards share: reading a provider's stop signal, and acting on it.

A provider says why it stopped in one string field whose name and values differ per provider
(OpenAI ``finish_reason``, Anthropic ``stop_reason``, Gemini ``finish_reason`` in upper case).
:class:`FinishReasonGuard` is the one implementation of "if the response stopped for *this*
reason, suppress its tool calls (a protocol repair: never counted as intent) and record the stop";
:mod:`.safety_finish_reason` and :mod:`.model_length` only say which signals and which words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import last_ai, replace_ai, suppress


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


def lowered(*values: str) -> frozenset[str]:
    return frozenset(v.lower() for v in values)


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


class FinishReasonGuard(KeelMiddleware):
    """Suppress the tool calls of a response that stopped for one of ``detectors``; record ``code``.

    The stop is recorded with or without tool calls: an answer cut by a filter or a length limit is
    not a clean success even when nothing was about to run.
    """

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(reads={"model_response.finish_reason"}, mutates={"model_response.tool_calls"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )
    detectors: ClassVar[tuple[Detector, ...]]
    code: ClassVar[str]
    stamp_key: ClassVar[str | None] = None  # additional_kwargs key for the detection, if any

    def situation(self, found: Detection) -> str:
        """What happened, as a clause (for the stop reason and the journal)."""
        raise NotImplementedError

    def note(self, found: Detection, names: list[str]) -> str:
        """The bracketed note appended to the response whose calls were suppressed."""
        raise NotImplementedError

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        response = await handler(request)
        ai = last_ai(response)
        found = None if ai is None else detect(ai, self.detectors)
        if ai is None or found is None:
            return response
        refs = call_refs(ai)
        names = [str(r["name"]) for r in refs]
        rewritten = ai
        if refs:
            rewritten = suppress(ai, self.name, self.note(found, names))
            self.intervene(request.runtime, "suppress_tool_calls", self.situation(found),
                           message_id=ai.id, tool_calls=refs)
        if self.stamp_key is not None:
            stamp = {"detector": found.detector, "field": found.field, "value": found.value,
                     "suppressed_tool_calls": names}
            rewritten = rewritten.model_copy(
                update={"additional_kwargs": {**rewritten.additional_kwargs, self.stamp_key: stamp}}
            )
        await self.stop(
            request.runtime, self.code,
            self.situation(found) + (f"; suppressed tool calls: {', '.join(names)}" if names else ""),
            data={"field": found.field, "value": found.value, "suppressed": names},
            cause=ai.id,
        )
        return response if rewritten is ai else replace_ai(response, ai, rewritten)


__all__ = ["Detection", "Detector", "FinishReasonGuard", "call_refs", "detect", "finish_value", "lowered"]
