"""RequestGrammar: the last look at a request before the provider, which enforces its grammar.

Every middleware outer of this one may rewrite the request; any of them — or the thread history
itself — can leave it in a shape a strict provider answers with HTTP 400, which in production
kills the run far from its cause. Sitting innermost and observing the final messages, system
prompt and tools, this guard checks the request against the provider grammar
(:mod:`agentkeel.harness.middleware.grammar`) and either

* **repairs** it (the default: production should keep running) and journals which rules it
  restored, or
* in **strict** mode (``mode="strict"`` or the harness's strict grammar, as in tests) raises
  :class:`RequestGrammarError` before the model sees the request, naming the producer: the thread
  history when the graph state already breaks the grammar, else a middleware outer of this one that
  does not trace its requests (AgentKeel middleware name themselves through ``traced``).
"""

from __future__ import annotations

from typing import Literal, cast

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AnyMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.grammar import RequestGrammarError, grammar_violation
from agentkeel.harness.middleware.repair import Repair, repair_request, summarize

HISTORY = "the thread history (graph state)"
UNTRACED = "a middleware without AgentKeel tracing, outer of RequestGrammar"


class RequestGrammar(KeelMiddleware):
    """Checks (and by default repairs) the final model request against the provider grammar."""

    contract = Contract(
        axes={
            "model": on(
                observes_final={"model_request.messages", "model_request.system", "model_request.tools"},
                mutates={"model_request.messages", "model_request.system"},
                slot="innermost",
            )
        },
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self, mode: Literal["repair", "strict"] = "repair") -> None:
        super().__init__()
        self.mode = mode
        # The same defect recurs on every model call of a run; journal each distinct repair once.
        self._reported: set[Repair] = set()

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        broken = grammar_violation(request.system_message, request.messages)
        if broken is None:
            return await handler(request)
        if self.mode == "strict" or self.strict_grammar:
            raise RequestGrammarError(self._producer(request), broken)
        repaired = repair_request(request.system_message, request.messages)
        if not self._reported.issuperset(repaired.repairs):
            self._reported.update(repaired.repairs)
            summary = summarize(repaired.repairs)
            self.intervene(
                request.runtime, "repair",
                f"repaired a request that broke the provider grammar ({'; '.join(summary['rules'])}); "
                f"first violation: {broken}",
                **summary, violation={"rule": broken.rule, "index": broken.index},
            )
        messages = cast(list[AnyMessage], repaired.messages)
        return await handler(request.override(messages=messages, system_message=repaired.system_message))

    @staticmethod
    def _producer(request: ModelRequest) -> str:
        history = request.state.get("messages", []) if isinstance(request.state, dict) else []
        return HISTORY if grammar_violation(request.system_message, history) is not None else UNTRACED


__all__ = ["HISTORY", "UNTRACED", "RequestGrammar"]
