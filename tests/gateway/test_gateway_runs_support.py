"""Fixtures and helpers of the gateway run-route tests (``test_gateway_runs*.py``).

Fast route tests drive the ASGI app in-process with ``httpx.ASGITransport`` (which buffers a
response until it ends, so streams are read after their run finished). Tests about live streaming
(heartbeats, disconnects, keep-alives) use :func:`live_server`: uvicorn on a free port in the
test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from agentkeel.cli.serve import GatewayServer
from agentkeel.config import KeelConfig
from agentkeel.gateway.app import create_app
from agentkeel.runtime.checkpoints import mode as mode_module
from agentkeel.runtime.runtime import Runtime, open_runtime

GRAPHS = textwrap.dedent(
    '''
    """Graphs for the gateway tests: steps with a delay, an interrupt, a failure."""
    import asyncio
    import operator
    from typing import Annotated, TypedDict

    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt


    class State(TypedDict, total=False):
        steps: int
        delay: float
        log: Annotated[list[str], operator.add]
        answer: str


    async def step(state: State) -> State:
        for index in range(state.get("steps", 1)):
            get_stream_writer()({"step": index})
            await asyncio.sleep(state.get("delay", 0))
        return {"log": ["stepped"]}


    def ask(state: State) -> State:
        answer = interrupt({"question": "approve?"})
        return {"answer": answer, "log": ["asked"]}


    def boom(state: State) -> State:
        raise ValueError("the graph failed on purpose")


    def _single(name, fn):
        builder = StateGraph(State)
        builder.add_node(name, fn)
        builder.add_edge(START, name)
        builder.add_edge(name, END)
        return builder.compile()


    echo = _single("step", step)
    hitl = _single("ask", ask)
    broken = _single("boom", boom)
    '''
)

FAST_SCRIPT = {"agents": {"lead": [{"say": "All done.", "usage": {"input": 10, "output": 2}}]}}
WRITER_SCRIPT = {
    "agents": {
        "lead": [
            {"tool_calls": [{"name": "write_file", "id": "call_w1",
                             "args": {"path": "/workspace/outputs/a.txt", "content": "hello"}}]},
            {"say": "Wrote it."},
        ]
    }
}


def make_config(tmp_path: Path, *, script: dict[str, Any] | None = None, gateway: dict[str, Any] | None = None,
                **overrides: Any) -> KeelConfig:
    (tmp_path / "graphs.py").write_text(GRAPHS)
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(script or FAST_SCRIPT))
    raw: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "database": "memory://",
        "models": [{"name": "fast", "use": "scripted", "script": "script.yaml"}],
        "graphs": {name: f"./graphs.py:{name}" for name in ("echo", "hitl", "broken")},
        "limits": {"stream_heartbeat_s": 0.2, "stream_ttl_s": 600},
        "gateway": {"heartbeat_s": 0.3, "wait_keepalive_s": 0.2, "drain_s": 1, **(gateway or {})},
    }
    raw.update(overrides)
    return KeelConfig(**raw, base_dir=tmp_path)


@pytest.fixture
def fresh_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint mode is frozen per process: let each test's runtime freeze its own."""
    monkeypatch.setattr(mode_module, "_frozen", None)


@pytest.fixture
async def runtime(tmp_path: Path, fresh_mode: None) -> AsyncIterator[Runtime]:
    async with open_runtime(make_config(tmp_path)) as rt:
        yield rt


@pytest.fixture
async def client(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(runtime), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=20) as http:
        yield http


async def new_thread(runtime: Runtime, thread_id: str = "t-1") -> str:
    await runtime.store.upsert_thread(thread_id)
    return thread_id


def parse_sse(text: str) -> list[dict[str, Any]]:
    """SSE frames as ``{event, data, id}`` (comments as ``{"comment": ...}``)."""
    frames = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        frame: dict[str, Any] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                frame["comment"] = line[1:].strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                frame[key] = value.removeprefix(" ")
        if "data" in frame:
            frame["data"] = json.loads(frame["data"])
        if frame:
            frames.append(frame)
    return frames


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {predicate}")
        await asyncio.sleep(0.02)


async def run_status(runtime: Runtime, run_id: str, *statuses: str) -> Any:
    async def check() -> Any:
        record = await runtime.store.get(run_id)
        return record if record is not None and record.status.value in statuses else None

    return await wait_until(check)


@contextlib.asynccontextmanager
async def live_server(config: KeelConfig) -> AsyncIterator[tuple[GatewayServer, httpx.AsyncClient]]:
    """The gateway (owning its runtime) under uvicorn on a free port, in this event loop."""
    app = create_app(config)
    server = GatewayServer(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning"), app)
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: asyncio.sleep(0, server.started or task.done()))
    assert server.started, "the server did not start"
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            yield server, http
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
