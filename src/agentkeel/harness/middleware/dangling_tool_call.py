"""DanglingToolCall: a tool call that never got its result must not make the next request a 400.

A run cancelled or crashed between the model's tool call and the tool's result leaves a thread
whose history ends (or continues) with an unanswered call; strict providers reject every later
request on that thread. This guard repairs the tool pairing of each outgoing request — synthetic
error results for unanswered calls, results regrouped after their call, orphans and duplicates
dropped, user notes moved after the results (:func:`repair.repair_tool_pairing`) — and never
writes graph state, so the history stays a faithful record of what happened.
"""

from __future__ import annotations

from typing import cast

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AnyMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.grammar import grammar_violation
from agentkeel.harness.middleware.repair import Repair, repair_tool_pairing, summarize


class DanglingToolCall(KeelMiddleware):
    """Repairs tool-call/result pairing in the request sent to the model (never in state)."""

    contract = Contract(
        axes={"model": on(mutates={"model_request.messages"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self) -> None:
        super().__init__()
        # The same broken history is repaired on every model call of the run; journal it once.
        self._reported: set[Repair] = set()

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        if grammar_violation(None, request.messages) is None:  # the common case: one cheap pass
            return await handler(request)
        messages, repairs = repair_tool_pairing(request.messages)
        if not repairs:
            return await handler(request)
        if not self._reported.issuperset(repairs):
            self._reported.update(repairs)
            summary = summarize(repairs)
            counts = ", ".join(f"{n} {action}" for action, n in summary["counts"].items())
            self.intervene(
                request.runtime, "repair", f"repaired tool-call pairing in the model request: {counts}",
                **summary, call_ids=sorted({r.subject for r in repairs if r.action == "synthetic_result"}),
            )
        return await handler(request.override(messages=cast(list[AnyMessage], messages)))


__all__ = ["DanglingToolCall"]
