"""SideEffectLedger: a tool call's intent is durable before the tool runs, and a call lost with a
worker is never repeated blindly.

Why: a run recovered after its worker died resumes at its last checkpoint, which for a crash
mid-tool is the step that *dispatched* the call, so LangGraph runs the call again. For ``read_file``
that is harmless; for ``bash`` or an appending ``write_file`` the effect may happen twice, and
nobody would know (Temporal and DBOS make the same point: a step is at-least-once, so an effect that
must not repeat needs either an idempotency key or a decision). The journal is where that decision
gets its facts.

How, per call, at the innermost edge of the tool axis (right before the tool, after every guard
that may refuse or answer it):

1. If the run's context lists the call in ``recovered_calls`` (the worker found its intent from an
   earlier attempt with no result and the tool is not idempotent), the tool is NOT run: the model
   receives an error result saying the outcome is unknown, that it was not repeated, and to check
   its effects before deciding to retry; an ``intervention`` (``recovered_call``) is journaled.
2. Otherwise ``tool.intent`` ``{call_id, name, idempotent, attempt}`` is journaled, and only then
   does the tool run (its result is journaled as ``tool.call`` by the runtime's callback handler)
   — or, in a re-run, the run's ``tool_replay`` answers it from the recording
   (:mod:`agentkeel.harness.tool_replay`). For a tool that is not idempotent the intent is
   written *through* (stored before the tool starts); an idempotent tool's intent is recorded in
   order and stored with the journal's next flush, because recovery re-runs such a call whether
   or not its intent survived, and a store round trip before every ``read_file`` or ``ls`` was
   most of what a tool call cost the runtime.
3. If the intent cannot be stored, a tool that is not idempotent is not run (a crash after it
   could not be told from one before it, so the guarantee would be void): the model gets an error
   result and ``intent_unrecorded`` is journaled. An idempotent tool runs anyway: repeating it is
   harmless.

Without a run context or journal (a graph run outside the runtime, plain tests) it passes calls
through. Tool idempotency is declared by the tool (:mod:`agentkeel.harness.tools.idempotency`).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from agentkeel.harness.middleware.base import KeelMiddleware, ToolHandler, ToolResult, run_context
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import TOOL_META
from agentkeel.harness.middleware.tool_meta import classify
from agentkeel.harness.tools.idempotency import is_idempotent

log = logging.getLogger(__name__)

TOOL_INTENT = "tool.intent"
"""The journal kind of a tool call's intent, journaled before the tool runs (stored before it
runs when the tool is not idempotent)."""


def recovered_message(name: str, tool_call_id: str, note: str, source: str) -> ToolMessage:
    """The result that answers a call lost with an earlier attempt, instead of running it again."""
    return _error(
        name, tool_call_id, source,
        f"Error: the outcome of this {name} call is unknown: the worker running it was lost while the "
        f"call was in progress ({note}). It was not repeated. Check its effects first (for example "
        "read the file it was writing or list the directory), then decide whether to run it again.",
    )


def unrecorded_message(name: str, tool_call_id: str, source: str) -> ToolMessage:
    """The result of a non-idempotent call refused because its intent could not be journaled."""
    return _error(
        name, tool_call_id, source,
        f"Error: {name} was not run: the run's journal could not record the call, and a tool that "
        "may not run twice only runs once its intent is recorded. Try again later, or go on without it.",
    )


def _error(name: str, tool_call_id: str, source: str, text: str) -> ToolMessage:
    message = ToolMessage(content=text, name=name, tool_call_id=tool_call_id, status="error")
    return message.model_copy(update={"additional_kwargs": {TOOL_META: classify(message, source)}})


class SideEffectLedger(KeelMiddleware):
    """Journals each tool call's intent before it runs; answers calls lost with a worker."""

    contract: ClassVar[Contract] = Contract(
        axes={"tool": on(reads={"tool_request.call_id"}, mutates={"tool_result"}, slot="innermost")},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolResult:
        ctx = run_context(request.runtime)
        if ctx is None or request.tool is None:  # outside the runtime, or a tool nobody will run
            return await handler(request)
        call = request.tool_call
        call_id, name = str(call.get("id") or ""), str(call.get("name") or "unknown")
        note = ctx.recovered_calls.get(call_id)
        if note is not None:
            self.intervene(
                request.runtime, "recovered_call",
                f"{name} was in progress when an earlier attempt's worker was lost; not repeated",
                tool=name, tool_call_id=call_id, note=note,
            )
            return recovered_message(name, call_id, note, self.name)
        if ctx.journal is None:
            return await handler(request)
        idempotent = is_idempotent(request.tool)
        intent = {"call_id": call_id, "name": name, "idempotent": idempotent, "attempt": ctx.attempt}
        caller = f"middleware:{self.name}"
        try:
            if idempotent:  # recovery re-runs it anyway: recorded in order, stored with the next flush
                ctx.journal.record(TOOL_INTENT, intent, caller=caller)
            else:
                await ctx.journal.write_through(TOOL_INTENT, intent, caller=caller)
        except Exception as exc:  # whatever the store raised: decided below (point 3 above)
            log.warning("run %s: intent of %s %s not journaled: %r", ctx.run_id, name, call_id, exc)
            self.intervene(
                request.runtime, "intent_unrecorded",
                f"the intent of {name} could not be journaled; "
                + ("ran anyway (idempotent)" if idempotent else "not run"),
                tool=name, tool_call_id=call_id, error_type=type(exc).__name__,
            )
            if not idempotent:
                return unrecorded_message(name, call_id, self.name)
        if ctx.tool_replay is not None:  # a re-run: the recording answers (harness/tool_replay.py)
            return await ctx.tool_replay.execute(request, handler)
        return await handler(request)


__all__ = ["TOOL_INTENT", "SideEffectLedger", "recovered_message", "unrecorded_message"]
