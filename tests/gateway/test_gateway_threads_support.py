"""Fixtures and helpers of the thread, assistant and store route tests.

The app under test is built here from the three routers alone (not ``create_app``), so these
tests pin exactly the routes they cover. Requests go in-process through ``httpx.ASGITransport``;
``sdk`` wraps the same transport in the official ``langgraph_sdk`` client.

``keel`` opens a runtime on the database a test asks for (``db`` parameter: memory, sqlite, or a
fresh PostgreSQL database per test, so searches and counts see only the test's own data).
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from langgraph_sdk.client import LangGraphClient

from agentkeel.config import KeelConfig
from agentkeel.gateway.errors import install_error_handlers
from agentkeel.gateway.routes import assistants, store, threads
from agentkeel.runtime.checkpoints import mode as mode_module
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import Runtime, open_runtime

GRAPHS = textwrap.dedent(
    '''
    """Graphs of the thread/assistant/store route tests."""
    import asyncio
    import operator
    from typing import Annotated

    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime
    from langgraph.types import interrupt
    from typing_extensions import TypedDict  # pydantic describes typing.TypedDict only on 3.12+


    class State(TypedDict, total=False):
        items: Annotated[list[str], operator.add]
        delay: float
        answer: str
        note: str


    async def add(state: State) -> State:
        await asyncio.sleep(state.get("delay", 0))
        return {"items": ["x"]}


    def ask(state: State) -> State:
        return {"answer": interrupt({"question": "approve?"}), "items": ["asked"]}


    async def recall(state: State, runtime: Runtime) -> State:
        item = await runtime.store.aget(("memories",), "favourite")
        return {"note": item.value["text"] if item else "nothing"}


    def _single(name, fn):
        builder = StateGraph(State)
        builder.add_node(name, fn)
        builder.add_edge(START, name)
        builder.add_edge(name, END)
        return builder.compile()


    echo = _single("add", add)
    hitl = _single("ask", ask)
    recall_graph = _single("recall", recall)
    nested = _single("child", _single("inner", ask))  # a subgraph that interrupts
    '''
)
LEAD_SCRIPT = {"agents": {"lead": [{"say": "All done."}]}}
GRAPH_NAMES = {"echo": "echo", "hitl": "hitl", "recall": "recall_graph", "nested": "nested"}
DATABASES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def database_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'keel.db'}"
    return str(request.getfixturevalue("fresh_pg_url"))


def make_config(tmp_path: Path, database: str, **overrides: Any) -> KeelConfig:
    """The test graphs, and a ``lead`` whose scripted model answers every run with one message."""
    (tmp_path / "graphs.py").write_text(GRAPHS)
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(LEAD_SCRIPT))
    return KeelConfig(
        data_dir=str(tmp_path / "data"),
        database=database,
        models=[{"name": "fast", "use": "scripted", "script": "script.yaml"}],
        graphs={name: f"./graphs.py:{attr}" for name, attr in GRAPH_NAMES.items()},
        base_dir=tmp_path,
        **overrides,
    )


def make_app(runtime: Runtime) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    for module in (threads, assistants, store):
        app.include_router(module.router)
    app.state.runtime = runtime
    return app


class Keel:
    """A runtime and an HTTP client on the three routers."""

    def __init__(self, runtime: Runtime, http: httpx.AsyncClient, transport: httpx.ASGITransport) -> None:
        self.runtime = runtime
        self.http = http
        self._transport = transport

    def sdk(self) -> LangGraphClient:
        return LangGraphClient(httpx.AsyncClient(transport=self._transport, base_url="http://127.0.0.1", timeout=20))

    async def run(self, thread_id: str, assistant_id: str = "echo", input: Any = None, **kwargs: Any) -> RunRecord:
        """Start a run and wait until it has finalized."""
        record = await self.start(thread_id, assistant_id, input, **kwargs)
        finished = await self.runtime.manager.wait(record.run_id)
        assert finished is not None and finished.status.terminal, finished
        return finished

    async def start(self, thread_id: str, assistant_id: str = "echo", input: Any = None, **kwargs: Any) -> RunRecord:
        request = RunRequest(thread_id=thread_id, assistant_id=assistant_id, input=input, **kwargs)
        return await self.runtime.manager.create(request)

    async def running(self, run_id: str) -> None:
        """Wait until the run is running (its thread is busy)."""
        for _ in range(500):
            record = await self.runtime.store.get(run_id)
            if record is not None and record.status is RunStatus.running:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"run {run_id} never started")


KeelFactory = Callable[..., contextlib.AbstractAsyncContextManager[Keel]]


@pytest.fixture
def fresh_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint mode is frozen per process: let each test's runtime freeze its own."""
    monkeypatch.setattr(mode_module, "_frozen", None)


@pytest.fixture
def db() -> str:
    """Overridden by ``@pytest.mark.parametrize("db", DATABASES)``; memory by default."""
    return "memory"


@pytest.fixture
def keel_factory(tmp_path: Path, db: str, request: pytest.FixtureRequest, fresh_mode: None) -> KeelFactory:
    """Open a runtime (again, on the same database and data directory, if called twice);
    keyword arguments override config keys."""
    url = database_url(db, tmp_path, request)

    @contextlib.asynccontextmanager
    async def open_keel(**overrides: Any) -> AsyncIterator[Keel]:
        async with open_runtime(make_config(tmp_path, url, **overrides)) as runtime:
            transport = httpx.ASGITransport(app=make_app(runtime))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=20) as http:
                yield Keel(runtime, http, transport)

    return open_keel


@pytest.fixture
async def keel(keel_factory: KeelFactory) -> AsyncIterator[Keel]:
    async with keel_factory() as opened:
        yield opened
