"""Running a checked chain: consecutive AgentKeel wrappers composed into one LangChain middleware.

``create_agent`` wraps every middleware's ``wrap_*`` hook in a LangSmith ``traceable``, which costs
two thread-pool hops and a task per hook per call — measured at about 8 ms per model turn for the
sixteen guards (``benchmarks/chain_overhead.py``), more than the rest of the agent loop. The chain
is already ordered and checked by :mod:`.chain`, so AgentKeel composes runs of its own wrap-only
middleware itself, Starlette-style: one visible loop per axis, first member outermost — exactly the
nesting LangChain would have built. Third-party middleware keep their place between the groups, so
the order LangChain executes is the checked order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langgraph.prebuilt.tool_node import ToolCallRequest

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler, ToolHandler, ToolResult
from agentkeel.harness.middleware.contracts import implemented_axes

_WRAP_AXES = frozenset({"model", "tool"})


def _composable(middleware: Any) -> bool:
    return isinstance(middleware, KeelMiddleware) and set(implemented_axes(middleware)) <= _WRAP_AXES


def _bind_model(member: KeelMiddleware, inner: ModelHandler) -> ModelHandler:
    async def call(request: ModelRequest) -> ModelResponse:
        # AgentKeel wrappers always answer with a ModelResponse (never a bare AIMessage).
        return cast(ModelResponse, await member.awrap_model_call(request, inner))

    return call


def _bind_tool(member: KeelMiddleware, inner: ToolHandler) -> ToolHandler:
    async def call(request: ToolCallRequest) -> ToolResult:
        return await member.awrap_tool_call(request, inner)

    return call


class ComposedGuards(AgentMiddleware):
    """One LangChain middleware running a run of AgentKeel wrappers in their checked order."""

    def __init__(self, members: Sequence[KeelMiddleware], name: str) -> None:
        super().__init__()
        self._name = name
        self.members = tuple(members)
        self._model = [m for m in self.members if "model" in implemented_axes(m)]
        self._tool = [m for m in self.members if "tool" in implemented_axes(m)]

    @property
    def name(self) -> str:
        return self._name

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        call = handler
        for member in reversed(self._model):  # the first member ends up outermost
            call = _bind_model(member, call)
        return await call(request)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolResult:
        call = handler
        for member in reversed(self._tool):
            call = _bind_tool(member, call)
        return await call(request)


def compose(middlewares: Sequence[Any]) -> list[Any]:
    """``middlewares`` (checked order) with each run of wrap-only AgentKeel members grouped."""
    out: list[Any] = []
    run: list[KeelMiddleware] = []
    for middleware in [*middlewares, None]:
        if middleware is not None and _composable(middleware):
            run.append(middleware)
            continue
        if run:
            groups = sum(isinstance(m, ComposedGuards) for m in out)
            out.append(ComposedGuards(run, "AgentKeelGuards" + (f"_{groups + 1}" if groups else "")))
            run = []
        if middleware is not None:
            out.append(middleware)
    return out


__all__ = ["ComposedGuards", "compose"]
