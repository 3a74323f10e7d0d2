"""One compiled agent graph for every run of an assistant: what is per run travels in the context.

Why: building an agent (``create_agent``: tool injection analysis, node subgraph detection, state
schema resolution, compiling) is a third of a run's start, and the runtime used to do it for every
run because every run gets fresh guards (they keep per-run state), a fresh model (a scripted
model's cursor, a provider's client) and a fresh ``task`` executor. Ten runs started together on one
event loop wait for each other's starts, so the start's cost is what the last of them waits for.

How: the harness compiles each assistant's graph once, with a placeholder model, a stand-in for each
LangChain middleware of the chain (same name, same hooks, same state schema, same tools) and a
``task`` tool that asks the context for its executor. A run's own parts — the model, the chain's
middleware instances, the executor — are a :class:`RunScope` carried by the run's
:class:`~agentkeel.harness.context.RunContext` (LangGraph's per-invocation dependency channel), and
the stand-ins forward every hook call to the run's instance at their position; the outermost model
wrapper among them (or a :class:`ScopeEntry`) hands every model call the run's model. A run whose
chain does not have the shape the graph was compiled for (:meth:`ScopeTemplate.fits`) gets a
graph of its own, built the old way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest
from langchain_core.language_models import BaseChatModel

# Every hook LangChain's agent factory looks for on a middleware's class.
STATE_HOOKS = ("before_agent", "before_model", "after_model", "after_agent")
WRAP_HOOKS = ("wrap_model_call", "wrap_tool_call")
ASYNC_HOOKS = frozenset(f"a{h}" for h in (*STATE_HOOKS, *WRAP_HOOKS))
HOOKS = (*STATE_HOOKS, *WRAP_HOOKS, *sorted(ASYNC_HOOKS))


class MissingRunScope(RuntimeError):
    """A shared graph was run without its run's scope in the context: a caller bug."""


@dataclass(frozen=True)
class RunScope:
    """What one run of a shared agent graph brings: its model, the LangChain middleware list of its
    chain (``Chain.for_agent()``), and its ``task`` executor (``None`` for an agent that cannot
    delegate)."""

    model: BaseChatModel
    middleware: tuple[Any, ...]
    executor: Any = None


def scope_of(runtime: Any) -> RunScope:
    """The run scope in a LangGraph ``Runtime``'s (or ``ToolRuntime``'s) context."""
    scope = getattr(getattr(runtime, "context", None), "run_scope", None)
    if not isinstance(scope, RunScope):
        raise MissingRunScope("this agent graph is shared between runs: its RunContext must carry the run's scope")
    return scope


def _state_forwarder(hook: str, index: int) -> Callable[..., Any]:
    if hook in ASYNC_HOOKS:
        async def forward_async(self: AgentMiddleware, state: Any, runtime: Any) -> Any:
            return await getattr(scope_of(runtime).middleware[index], hook)(state, runtime)
        return forward_async

    def forward(self: AgentMiddleware, state: Any, runtime: Any) -> Any:
        return getattr(scope_of(runtime).middleware[index], hook)(state, runtime)
    return forward


def _wrap_forwarder(hook: str, index: int, entry: bool) -> Callable[..., Any]:
    """``entry``: the outermost model wrapper, which hands the request the run's model first."""
    give_model = entry and "model" in hook
    if hook in ASYNC_HOOKS:
        async def forward_async(self: AgentMiddleware, request: Any, handler: Callable[..., Awaitable[Any]]) -> Any:
            scope = scope_of(request.runtime)
            if give_model:
                request = request.override(model=scope.model)
            return await getattr(scope.middleware[index], hook)(request, handler)
        return forward_async

    def forward(self: AgentMiddleware, request: Any, handler: Callable[..., Any]) -> Any:
        scope = scope_of(request.runtime)
        if give_model:
            request = request.override(model=scope.model)
        return getattr(scope.middleware[index], hook)(request, handler)
    return forward


def _overridden(cls: type, hook: str) -> bool:
    return getattr(cls, hook) is not getattr(AgentMiddleware, hook)


def _wraps_model(cls: type) -> bool:
    return _overridden(cls, "wrap_model_call") or _overridden(cls, "awrap_model_call")


def stand_in(template: Any, index: int, *, entry: bool = False) -> AgentMiddleware:
    """A middleware that looks to LangChain's factory exactly like ``template`` (the hooks its class
    overrides, their jump targets, its name, state schema, tools and trace policy) and forwards
    each hook call to the run's middleware at ``index``; ``entry``: it is the outermost model
    wrapper, and gives each model request the run's model before forwarding it."""
    namespace: dict[str, Any] = {
        "state_schema": template.state_schema,
        "name": property(lambda self: self._name),
        "__doc__": f"Stand-in for the run's {template.name!r} (position {index}).",
    }
    for hook in HOOKS:
        if not _overridden(type(template), hook):
            continue
        forward = _wrap_forwarder(hook, index, entry) if "wrap_" in hook else _state_forwarder(hook, index)
        jumps = getattr(getattr(type(template), hook), "__can_jump_to__", None)
        if jumps is not None:
            forward.__can_jump_to__ = jumps  # type: ignore[attr-defined]
        namespace[hook] = forward
    cls = type(f"StandIn_{type(template).__name__}", (AgentMiddleware,), namespace)
    middleware = cls()
    middleware._name = template.name
    middleware.tools = list(getattr(template, "tools", []))
    middleware.trace_policy = getattr(template, "trace_policy", None)
    return middleware


def stand_ins(middleware: Sequence[Any]) -> list[AgentMiddleware]:
    """What a shared graph is compiled with for ``middleware``: a stand-in per member, the
    outermost model wrapper among them giving each model call the run's model (or, with none, a
    :class:`ScopeEntry` first). Members outer of it never see a model request."""
    first = next((i for i, m in enumerate(middleware) if _wraps_model(type(m))), None)
    doubles: list[AgentMiddleware] = [stand_in(m, i, entry=i == first) for i, m in enumerate(middleware)]
    return doubles if first is not None else [ScopeEntry(), *doubles]


class ScopeEntry(AgentMiddleware):
    """Outermost on a shared graph none of whose middleware wraps model calls: every model call
    gets the run's model (the graph was compiled with a placeholder that refuses to run).

    Only then: LangChain wraps each middleware's ``wrap_*`` hook in a LangSmith ``traceable`` that
    costs thread-pool hops on every call, so the first stand-in that wraps model calls does the
    same job when there is one."""

    @property
    def name(self) -> str:
        return "AgentKeelRunScope"

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Any]) -> Any:
        return handler(request.override(model=scope_of(request.runtime).model))

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        return await handler(request.override(model=scope_of(request.runtime).model))


def _shape(middleware: Any) -> tuple[Any, ...]:
    # Tools by identity: the shared graph's tool node runs the template's tool objects, so a
    # middleware that makes tools of its own per instance (state in them) cannot share it.
    return (type(middleware), middleware.name, middleware.state_schema,
            tuple(id(t) for t in getattr(middleware, "tools", [])))


@dataclass(frozen=True)
class ScopeTemplate:
    """The middleware list a shared graph was compiled for, by shape."""

    shapes: tuple[tuple[Any, ...], ...]

    @classmethod
    def of(cls, middleware: Sequence[Any]) -> ScopeTemplate:
        return cls(tuple(_shape(m) for m in middleware))

    def fits(self, middleware: Sequence[Any]) -> bool:
        """Whether a run's middleware list can run on the graph compiled for this template: the
        same classes, names, state schemas and tool objects, position by position."""
        return len(middleware) == len(self.shapes) and all(
            _shape(m) == shape for m, shape in zip(middleware, self.shapes, strict=True)
        )


__all__ = ["MissingRunScope", "RunScope", "ScopeEntry", "ScopeTemplate", "scope_of", "stand_in", "stand_ins"]
