"""What every AgentKeel middleware shares: a contract, the run context, and honest reporting.

Hooks are async only: AgentKeel drives every graph through ``astream``. Instances live for one run
(the harness builds a fresh chain per run), so per-run state is plain instance state — nothing
module-global outlives a run except the read-before-write path locks, which must be shared by the
parallel tool calls of one message.

Why ``traced``: a request that breaks the provider's message grammar is easy to detect at the
innermost layer and hard to attribute there. Each AgentKeel wrapper passes its ``handler`` through
:meth:`KeelMiddleware.traced`; in strict mode a wrapper whose outgoing request breaks the grammar
while its incoming one did not is named as the producer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.context import RunContext
from agentkeel.harness.middleware.contracts import Contract
from agentkeel.harness.middleware.grammar import RequestGrammarError, grammar_violation
from agentkeel.harness.middleware.responses import hint_message
from agentkeel.harness.stop_reasons import StopReasonCollector

ModelHandler = Callable[[ModelRequest], Awaitable[ModelResponse]]
ToolResult = ToolMessage | Command[Any]
ToolHandler = Callable[[ToolCallRequest], Awaitable[ToolResult]]
RequestView = Callable[[SystemMessage | None, Sequence[BaseMessage]], tuple[SystemMessage | None, Sequence[BaseMessage]]]


def run_context(runtime: Any) -> RunContext | None:
    """The trusted run context from a hook's ``runtime`` (or a request's), if the graph has one."""
    ctx = getattr(runtime, "context", None)
    return ctx if isinstance(ctx, RunContext) else None


class KeelMiddleware(AgentMiddleware):
    """Base of AgentKeel's middleware. Subclasses set ``contract`` and implement async hooks."""

    contract: ClassVar[Contract]
    # Set on every member by the harness when the chain runs in strict grammar mode.
    strict_grammar: bool = False

    def __init__(self) -> None:
        super().__init__()
        self._fallback_reasons = StopReasonCollector.standalone()

    @property
    def name(self) -> str:
        return type(self).__name__

    # -- reporting -------------------------------------------------------------------------
    def collector(self, runtime: Any) -> StopReasonCollector:
        ctx = run_context(runtime)
        return ctx.stop_reasons if ctx is not None else self._fallback_reasons

    async def stop(
        self,
        runtime: Any,
        code: str,
        detail: str,
        data: dict[str, Any] | None = None,
        cause: str | None = None,
    ) -> dict[str, Any]:
        """Record a stop reason through the run's collector (the single writer)."""
        return await self.collector(runtime).record(code, self.name, detail=detail, data=data, cause=cause)

    def intervene(self, runtime: Any, action: str, detail: str, **data: Any) -> None:
        """Journal an ``intervention`` (best effort: a journal problem never breaks the run)."""
        ctx = run_context(runtime)
        if ctx is None or ctx.journal is None:
            return
        try:
            ctx.journal.record(
                "intervention",
                {"middleware": self.name, "action": action, "detail": detail, **data},
                caller=f"middleware:{self.name}",
            )
        except Exception:  # pragma: no cover - the journal itself never raises
            pass

    # -- model-call plumbing ---------------------------------------------------------------
    def traced(self, incoming: ModelRequest, handler: ModelHandler, *, sent_as: RequestView | None = None) -> ModelHandler:
        """``handler``, checking in strict mode that what this wrapper sends keeps the grammar.

        ``sent_as``: how the request reaches the provider when the contract guarantees an inner
        middleware reshapes it (a producer of system messages is checked as SystemMessageCoalescing
        will send its request)."""
        if not self.strict_grammar:
            return handler

        async def call(request: ModelRequest) -> ModelResponse:
            if request.messages is not incoming.messages or request.system_message is not incoming.system_message:
                system: SystemMessage | None = request.system_message
                messages: Sequence[BaseMessage] = request.messages
                if sent_as is not None:
                    system, messages = sent_as(system, messages)
                broken = grammar_violation(system, messages)
                if broken is not None and grammar_violation(incoming.system_message, incoming.messages) is None:
                    raise RequestGrammarError(self.name, broken)
            return await handler(request)

        return call


class HintQueue:
    """Transient notes for the *next* model request, delivered at its end, never into state.

    ``pending`` peeks and ``delivered`` commits only after the provider answered, so a retried call
    (LLMErrorHandling re-running the inner chain) carries the same notes instead of losing them.
    """

    def __init__(self, name: str, limit: int = 4) -> None:
        self.name = name
        self._limit = limit
        self._items: list[str] = []

    def push(self, text: str) -> None:
        if text not in self._items:
            self._items = [*self._items, text][-self._limit :]

    def pending(self) -> list[str]:
        return list(self._items)

    def delivered(self, texts: list[str]) -> None:
        self._items = [t for t in self._items if t not in texts]

    def apply(self, request: ModelRequest) -> tuple[ModelRequest, list[str]]:
        """``request`` with the pending notes appended as one message, and the notes sent."""
        texts = self.pending()
        if not texts:
            return request, texts
        return request.override(messages=[*request.messages, hint_message(self.name, texts)]), texts


__all__ = ["HintQueue", "KeelMiddleware", "ModelHandler", "RequestView", "ToolHandler", "ToolResult", "run_context"]
