"""TurnLimit: end an agent after ``max_turns`` model turns, keeping its partial answer (``turn_capped``).

Why: DeerFlow bounded turns with the graph's recursion limit, which counts super-steps (so the
bound moved with the number of middleware nodes) and ends the run with ``GraphRecursionError``,
discarding the partial work. Here a turn is one successful model call of this agent (a failed
call that a retry repeats is not a turn). When the count reaches ``max_turns`` and the response
asks for tool calls, they are withheld and its text stays as the final (partial) answer; the run
then ends through the ordinary "no tool calls" route. ``turn_capped`` is recorded once per run.
"""

from __future__ import annotations

from langchain.agents.middleware.types import ModelRequest, ModelResponse

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import intended_calls, last_ai, replace_ai, withhold
from agentkeel.limits import TurnLimits


class TurnLimit(KeelMiddleware):
    """Withholds tool calls from the ``max_turns``-th model turn on; see the module docstring."""

    contract = Contract(
        # Sees the calls after the protocol repairs, like every guard that withholds.
        axes={"model": on(observes_final={"model_response.tool_calls"}, mutates={"model_response.dispatch"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self, limits: TurnLimits) -> None:
        super().__init__()
        self.limits = limits
        self.turns = 0
        self._capped = False

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        response = await handler(request)
        self.turns += 1
        ai = last_ai(response)
        if self.turns < self.limits.max_turns or ai is None or not intended_calls(ai):
            return response

        limit = self.limits.max_turns
        note = f"[TURN LIMIT] This agent used its {limit} model turns; these tool calls were not run."
        runtime = request.runtime
        if not self._capped:
            self._capped = True
            detail = f"Model turn {self.turns} reached the limit of {limit}; tool calls withheld."
            await self.stop(runtime, "turn_capped", detail, {"max_turns": limit, "turns": self.turns}, cause=ai.id)
        self.intervene(runtime, "withhold", note, message_id=ai.id)
        return replace_ai(response, ai, withhold(ai, self.name, note))


__all__ = ["TurnLimit"]
