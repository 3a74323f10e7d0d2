"""The event loop and HTTP parser every ``keel`` process runs on: uvloop and httptools when installed.

Why: one event loop executes all the runs of a process and answers all its HTTP requests, so the
loop's own cost per wake-up, per socket write and per timer is paid on every chunk of every run,
and the HTTP parser's on every request. uvloop (libuv) and httptools (llhttp) do that work in C;
asyncio's selector loop and h11 do it in Python. Measured on ``keel serve`` with
``benchmarks/gateway.py --quick`` against asyncio's loop and h11 (figures in
``docs/operations.md``): a ``POST /threads`` round trip and a one-step run's stream take about a
third less time, custom events stream 1.5-2x faster. Both are dependencies where they build
(uvloop has no Windows build); without them every command still works, on asyncio and h11.

The choice is made here, once, for ``keel serve`` (passed to uvicorn), ``keel worker`` and the
one-shot commands (``run_async``), so a process never mixes the two.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# What uvicorn is told (its ``loop`` and ``http`` settings), decided once from what is installed.
UVICORN_LOOP: Literal["uvloop", "asyncio"] = "uvloop" if _installed("uvloop") else "asyncio"
UVICORN_HTTP: Literal["httptools", "h11"] = "httptools" if _installed("httptools") else "h11"


def loop_factory(loop: Literal["uvloop", "asyncio"] = UVICORN_LOOP) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory for ``"uvloop"`` (the default when it is installed); ``None``
    (asyncio's default loop) for ``"asyncio"``."""
    if loop != "uvloop":
        return None
    import uvloop

    return uvloop.new_event_loop


def run_async(main: Coroutine[Any, Any, T], loop: Literal["uvloop", "asyncio"] = UVICORN_LOOP) -> T:
    """``asyncio.run`` on the loop this module chose (``loop``: another, for side-by-side
    measurements in ``benchmarks/``)."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)


__all__ = ["UVICORN_HTTP", "UVICORN_LOOP", "loop_factory", "run_async"]
