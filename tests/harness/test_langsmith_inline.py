"""LangSmith's bookkeeping around each middleware call stays on the loop when nothing is traced."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import langsmith
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.tools import tool
from langsmith import run_helpers
from langsmith._runtime_overrides import get_runtime_overrides

from agentkeel.harness import langsmith_inline
from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptSession

SCRIPT = Script.model_validate({"strict": True, "agents": {"lead": [
    {"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
    {"tool_calls": [{"name": "add", "args": {"a": 3, "b": 4}}]},
    {"say": "Done."},
]}})


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Wrapping(AgentMiddleware[Any, Any]):
    """Wraps both calls, as the product's chains do: create_agent makes each a LangSmith traceable."""

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the LangSmith bookkeeping handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.bookkeeping = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if isinstance(fn, functools.partial) and fn.func.__name__ == "run" and _bookkeeping(fn.args[0]):
            self.bookkeeping += 1
        return super().submit(fn, *args, **kwargs)


def _bookkeeping(func: Any) -> bool:
    inner = func.func if isinstance(func, functools.partial) else func
    return inner in (run_helpers._setup_run, run_helpers._handle_container_end)


@pytest.fixture
def restored_overrides() -> Iterator[None]:
    before = get_runtime_overrides().aio_to_thread
    yield
    langsmith.set_runtime_overrides(aio_to_thread=before)


async def _hand_offs(key: str) -> int:
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    model = ScriptedChatModel(script=SCRIPT, session=ScriptSession(key))
    agent = create_agent(model=model, tools=[add], middleware=[Wrapping()])
    result = await agent.ainvoke({"messages": [{"role": "user", "content": "add"}]})
    assert result["messages"][-1].content == "Done."
    return executor.bookkeeping


async def test_untraced_model_and_tool_calls_hand_nothing_to_threads(restored_overrides: None) -> None:
    langsmith.set_runtime_overrides(aio_to_thread=None)
    assert await _hand_offs("threads") == 10  # 3 model calls and 2 tool calls, each a set-up and an end
    assert langsmith_inline.install() is True
    assert await _hand_offs("inline") == 0


async def test_a_traced_call_and_other_functions_still_go_to_langsmiths_threads() -> None:
    handed: list[Any] = []

    async def default(ctx: contextvars.Context, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        handed.append(func)
        return "thread"

    traced = contextvars.copy_context()
    traced.run(langsmith.tracing_context(enabled=True).__enter__)  # tracing on for what runs in ``traced``
    setup_kwargs = {"container_input": {}}
    assert await langsmith_inline.inline_when_untraced(default, traced, run_helpers._setup_run, **setup_kwargs) == "thread"
    end = functools.partial(run_helpers._handle_container_end)
    assert await langsmith_inline.inline_when_untraced(default, traced, end, {"new_run": object()}) == "thread"
    assert await langsmith_inline.inline_when_untraced(default, contextvars.copy_context(), sum, [1, 2]) == "thread"
    assert handed == [run_helpers._setup_run, end, sum]


def test_another_override_is_left_in_place(restored_overrides: None) -> None:
    async def theirs(default: Any, ctx: contextvars.Context, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        return ctx.run(func, *args, **kwargs)

    langsmith.set_runtime_overrides(aio_to_thread=theirs)
    assert langsmith_inline.install() is False
    assert get_runtime_overrides().aio_to_thread is theirs
