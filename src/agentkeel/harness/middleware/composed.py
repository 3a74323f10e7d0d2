"""Running a checked chain: consecutive AgentKeel wrappers composed into one LangChain middleware.

``create_agent`` wraps every middleware's ``wrap_*`` hook in a LangSmith ``traceable``, which costs
two thread-pool hops and a task per hook per call — measured at about 8 ms per model turn for the
sixteen guards (``benchmarks/chain_overhead.py``), more than the rest of the agent loop. The chain
is already ordered and checked by :mod:`.chain`, so AgentKeel composes runs of its own wrap-only
middleware itself, Starlette-style: one visible loop per axis, first member outermost — exactly the
nesting LangChain would have built. Third-party middleware keep their place between the groups, so
the order LangChain executes is the checked order.

A member may answer with an ``ExtendedModelResponse`` (a response plus a state update written with
the model step, as DurableContext does). Inside a group the members outer of it see the plain
response, as LangChain's own composition gives them; the group answers with the response and the
members' updates together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ExtendedModelResponse, ModelRequest, ModelResponse
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler, ToolHandler, ToolResult
from agentkeel.harness.middleware.contracts import implemented_axes

_WRAP_AXES = frozenset({"model", "tool"})


def _composable(middleware: Any) -> bool:
    return isinstance(middleware, KeelMiddleware) and set(implemented_axes(middleware)) <= _WRAP_AXES


def _bind_model(member: KeelMiddleware, inner: ModelHandler, updates: list[dict[str, Any]]) -> ModelHandler:
    async def call(request: ModelRequest) -> ModelResponse:
        # AgentKeel wrappers answer with a ModelResponse (never a bare AIMessage), or with one
        # extended by a state update, which the group hands on and its outer members never see.
        result = await member.awrap_model_call(request, inner)
        if isinstance(result, ExtendedModelResponse):
            if result.command is not None and isinstance(result.command.update, dict):
                updates.append(result.command.update)
            return result.model_response
        return cast(ModelResponse, result)

    return call


def _merged(updates: list[dict[str, Any]]) -> dict[str, Any]:
    """One state update from several: list values (channel writes of reducers) concatenated."""
    out: dict[str, Any] = {}
    for update in updates:
        for key, value in update.items():
            old = out.get(key)
            out[key] = [*old, *value] if isinstance(old, list) and isinstance(value, list) else value
    return out


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
        # The state channels a member writes must exist in the graph LangChain builds.
        default = getattr(AgentMiddleware, "state_schema")  # noqa: B009 (a generic class attribute)
        schemas = {m.state_schema for m in self.members if m.state_schema is not default}
        if len(schemas) > 1:
            raise ValueError(f"{name}: members declare different state schemas: {sorted(map(str, schemas))}")
        if schemas:
            self.state_schema = schemas.pop()
        self._model = [m for m in self.members if "model" in implemented_axes(m)]
        self._tool = [m for m in self.members if "tool" in implemented_axes(m)]

    @property
    def name(self) -> str:
        return self._name

    async def awrap_model_call(
        self, request: ModelRequest, handler: ModelHandler
    ) -> ModelResponse | ExtendedModelResponse[Any]:
        updates: list[dict[str, Any]] = []
        call = handler
        for member in reversed(self._model):  # the first member ends up outermost
            call = _bind_model(member, call, updates)
        response = await call(request)
        if not updates:
            return response
        return ExtendedModelResponse(model_response=response, command=Command(update=_merged(updates)))

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
