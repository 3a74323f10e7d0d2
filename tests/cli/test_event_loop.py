"""The ``keel`` processes run on uvloop and parse HTTP with httptools (both are dependencies)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvicorn
from fastapi import FastAPI

from agentkeel.cli.event_loop import UVICORN_HTTP, UVICORN_LOOP, run_async

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build")


def test_one_shot_commands_run_on_uvloop() -> None:
    async def loop_module() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert run_async(loop_module()).startswith("uvloop")
    assert run_async(loop_module(), "asyncio").startswith("asyncio")  # the benchmarks' --loop asyncio


def test_keel_serve_tells_uvicorn_to_use_uvloop_and_httptools() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert (UVICORN_LOOP, UVICORN_HTTP) == ("uvloop", "httptools")
    config = uvicorn.Config(FastAPI(), loop=UVICORN_LOOP, http=UVICORN_HTTP)
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol
    factory = config.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()


def test_run_async_returns_the_result_and_raises_the_error() -> None:
    async def fails() -> None:
        raise LookupError("from the coroutine")

    async def answers() -> int:
        return 42

    assert run_async(answers()) == 42
    with pytest.raises(LookupError, match="from the coroutine"):
        run_async(fails())
