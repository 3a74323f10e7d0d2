"""LangSmith's per-call bookkeeping runs on the event loop when nothing is traced, not in threads.

Why: LangChain's ``create_agent`` wraps every middleware's ``awrap_model_call`` and
``awrap_tool_call`` in LangSmith's ``traceable``. Each wrapped call hands LangSmith's run set-up
(``_setup_run``) and run end (``_handle_container_end``) to the loop's default thread pool and
waits for them, and runs the call itself in a task of its own -- whether or not anything is
traced. A model turn and a tool call therefore cost four thread round trips and two tasks, the
loop sitting idle through each hand-off: on a 30-step run that was about a sixth of the run's
time and CPU (``benchmarks/stores.py``, figures in the CHANGELOG).

How: LangSmith's documented hook for where that work runs (``langsmith.set_runtime_overrides``)
is given a function that runs those two calls inline, in the context LangSmith asks for, when
they cannot reach LangSmith: the set-up when tracing is off for the call (it then posts nothing),
the end when the set-up made no run. Everything else -- a traced call, any other function
LangSmith hands over (evaluators, client calls) -- goes to LangSmith's own thread hand-off as
before. The hook is process-wide: it is installed once, by the first ``Harness``, and never
over one somebody else installed (a Temporal worker's, say).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from langsmith import run_helpers
from langsmith.utils import tracing_is_enabled

DefaultHandOff = Callable[..., Awaitable[Any]]


def install() -> bool:
    """Install the inline hand-off unless another one is installed; True when ours is in place.
    A LangSmith without the hook (older releases) keeps its threads: nothing breaks, it is slower."""
    try:
        from langsmith import set_runtime_overrides
        from langsmith._runtime_overrides import get_runtime_overrides
    except ImportError:
        return False
    current = get_runtime_overrides().aio_to_thread
    if current is None and hasattr(run_helpers, "_setup_run") and hasattr(run_helpers, "_handle_container_end"):
        set_runtime_overrides(aio_to_thread=inline_when_untraced)
        return True
    return current is inline_when_untraced


async def inline_when_untraced(
    default: DefaultHandOff, ctx: contextvars.Context, func: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    """LangSmith's ``aio_to_thread`` override: ``func`` inside ``ctx``, inline when it is one of
    the two untraced bookkeeping calls, else in LangSmith's default thread hand-off."""
    if _untraced_bookkeeping(ctx, func, args, kwargs):
        return ctx.run(func, *args, **kwargs)
    return await default(ctx, func, *args, **kwargs)


def _untraced_bookkeeping(
    ctx: contextvars.Context, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    if func is run_helpers._setup_run:
        # It posts a run only when the traceable forces tracing or tracing is on in ``ctx``.
        forced = (kwargs.get("container_input") or {}).get("enabled") is True
        return not forced and not ctx.run(tracing_is_enabled)
    if isinstance(func, functools.partial) and func.func is run_helpers._handle_container_end:
        container = args[0] if args else kwargs.get("container")
        return isinstance(container, dict) and container.get("new_run") is None  # nothing to end
    return False


__all__ = ["install", "inline_when_untraced"]
