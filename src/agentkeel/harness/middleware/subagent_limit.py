"""SubagentLimit: bound the ``task`` calls a response and a run may make (``subagent_limit_capped``).

Why: every ``task`` call starts a whole agent, and a lead that fans out without a bound multiplies
the run's cost by the fan-out (DeerFlow's lead dispatched three batches of three overlapping
subagents for one paper). Two bounds, from ``subagents:``:

* ``max_concurrent`` — task calls of one response that run (they run side by side);
* ``max_per_run`` — task calls the run may make in all. The calls already made are counted from
  the delegation ledger (the ``delegations`` channel): its entries of this run, or every entry when
  there is no run context (the stricter choice). Compaction takes messages out of what the model
  is sent, never entries out of the ledger, so it cannot reset the count; and the ledger keeps the
  newest :data:`~agentkeel.harness.durable.LEDGER_CAP` entries, no fewer than ``max_per_run`` can
  be, so a run's own entries are all there.

The response keeps its first ``min(max_concurrent, max_per_run - made)`` task calls (by position;
every other tool call stays); the rest are withheld before they run (:func:`withhold` with
``keep``: same message id, raw provider fields and content blocks of the dropped calls gone,
``finish_reason`` still ``tool_calls`` while calls remain). Which calls and why goes into the
message text as a bracketed note: the dropped calls are gone from the message, so no result is
owed for them (no dangling call id), and the note stays on the message for every later turn, where
a hint in the next request would be seen once. When no call remains the response ends the run like
any stripped response (TerminalResponse asks once for the final answer). ``subagent_limit_capped``
is recorded once per run — also when a response is only cut down to the remaining budget (DeerFlow
dropped those silently) — and an ``intervention`` every time calls are dropped.

Like the other withholding guards it decides over the calls the model *intended*
(:func:`intended_calls`), so its verdict does not depend on where it sits among them. It must sit
inside DurableContext, which records the ledger entries from the final response: then only calls
that run get an entry. The contract says so (it mutates ``model_response.dispatch``, which
DurableContext observes final); no position is hard-coded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import ToolCall, ToolMessage

from agentkeel.harness.durable import DelegationEntry, durable_values
from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler, run_context
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.durable_context import TASK_TOOL
from agentkeel.harness.middleware.responses import intended_calls, last_ai, replace_ai, withhold

DESCRIPTION_CHARS = 80
"""The most of a dropped call's description the note quotes."""


def delegated(ledger: Sequence[DelegationEntry], run_id: str | None) -> int:
    """Distinct ledger entries of run ``run_id`` (every entry when ``run_id`` is None)."""
    return len({e.get("id") for e in ledger if e.get("id") and (run_id is None or e.get("run_id") == run_id)})


def _label(call: ToolCall) -> str:
    description = str((call.get("args") or {}).get("description") or "").strip()
    if len(description) > DESCRIPTION_CHARS:
        description = description[: DESCRIPTION_CHARS - 1] + "…"
    return f"{call.get('id')} ({description!r})" if description else str(call.get("id"))


class SubagentLimit(KeelMiddleware):
    """Withholds the ``task`` calls past the per-response and per-run bounds; see the module
    docstring."""

    contract = Contract(
        axes={"model": on(
            reads={"model_request.state", "model_response.tool_calls"},
            # Like every guard that withholds: it sees the calls after the protocol repairs, and
            # DurableContext sees its decision (only dispatched calls get a ledger entry).
            observes_final={"model_response.tool_calls"},
            mutates={"model_response.dispatch"},
        )},
        # Present exactly when the agent has the task tool (catalog.guard_members).
        mandatory_for=frozenset(),
    )

    def __init__(self, max_concurrent: int, max_per_run: int) -> None:
        super().__init__()
        if max_concurrent < 1 or max_per_run < 1:
            raise ValueError("max_concurrent and max_per_run must be >= 1")
        self.max_concurrent = max_concurrent
        self.max_per_run = max_per_run
        self._capped = False

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        response = await handler(request)
        ai = last_ai(response)
        if ai is None:
            return response
        ctx = run_context(request.runtime)
        prior = delegated(durable_values(request.state)["delegations"], ctx.run_id if ctx is not None else None)
        remaining = max(0, self.max_per_run - prior)
        # A call answered in the response itself (malformed arguments) never runs: not counted.
        answered = {m.tool_call_id for m in response.result if isinstance(m, ToolMessage)}
        tasks = [c for c in intended_calls(ai) if c.get("name") == TASK_TOOL and c.get("id") not in answered]
        kept = min(len(tasks), self.max_concurrent, remaining)
        over = tasks[kept:]
        if not over:
            return response

        dropped = [str(c.get("id")) for c in over]
        if remaining <= self.max_concurrent:
            why = (f"this run may delegate {self.max_per_run} tasks in all and has delegated {prior} already"
                   + (f", so only the first {kept} of this response run" if kept else ""))
            advice = "Do the remaining work yourself with your own tools, or answer with what you have."
        else:
            why = f"at most {self.max_concurrent} task calls of one response run; the first {kept} of this response do"
            advice = "Delegate the rest in a later response if you still need them."
        note = (f"[SUBAGENT LIMIT] These task calls were not run: {', '.join(_label(c) for c in over)}. "
                f"Why: {why}. {advice}")
        runtime = request.runtime
        if not self._capped:
            self._capped = True
            data: dict[str, Any] = {
                "dropped": dropped, "kept": kept, "max_concurrent": self.max_concurrent,
                "max_per_run": self.max_per_run, "prior": prior,
            }
            detail = f"{len(over)} task call(s) withheld: {why}."
            await self.stop(runtime, "subagent_limit_capped", detail, data, cause=ai.id)
        self.intervene(runtime, "withhold", note, message_id=ai.id, dropped=dropped)
        gone = {c.get("id") for c in over}
        keep = [c for c in ai.tool_calls if c.get("id") not in gone]
        return replace_ai(response, ai, withhold(ai, self.name, note, keep=keep))


__all__ = ["SubagentLimit", "delegated"]
