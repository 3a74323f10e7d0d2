"""A real ``keel serve`` process for the SDK integration tests (``test_sdk_*.py``) and the benchmark.

Why a subprocess and not uvicorn in the test's loop: the suite must prove what a deployment sees —
the CLI entry point, config loading, the lifespan, signal handling and the exit status — and a
client sharing the server's event loop would hide scheduling problems that a real client exposes.

Each server gets its own folder with a config, ``graphs.py`` (plain LangGraph graphs, a LangChain
fake chat model, an ``interrupt()`` graph, a subgraph) and a scripted-model script for the ``lead``
agent. Servers are expensive (5-10 s to start on 2 cores, mostly imports), so the fixtures in
``conftest.py`` share one per session; only tests that stop or restart a server start their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

GRAPH_NAMES = ("echo", "chat", "hitl", "nested", "broken")

GRAPHS_PY = textwrap.dedent(
    '''
    """Graphs served by the SDK integration tests and the gateway benchmark.

    ``echo`` runs ``steps`` supersteps; each writes ``custom`` custom events, sleeps ``delay`` s and
    appends one AI message. ``chat`` streams a fake chat model's tokens. ``hitl`` asks a human.
    ``nested`` runs a subgraph (for ``|ns`` event names). ``broken`` fails.
    """
    import asyncio
    import operator
    from typing import Annotated, Any, TypedDict

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, AnyMessage
    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.types import interrupt


    class State(TypedDict, total=False):
        messages: Annotated[list[AnyMessage], add_messages]
        steps: int
        custom: int
        delay: float
        done: Annotated[int, operator.add]


    async def step(state: State) -> dict[str, Any]:
        index = state.get("done", 0)
        writer = get_stream_writer()
        for j in range(state.get("custom", 0)):
            writer({"step": index, "j": j})
        if state.get("delay"):
            await asyncio.sleep(state["delay"])
        return {"messages": [AIMessage(content=f"step {index}", id=f"step-{index}")], "done": 1}


    def again(state: State) -> str:
        return "step" if state.get("done", 0) < state.get("steps", 1) else END


    _echo = StateGraph(State)
    _echo.add_node("step", step)
    _echo.add_edge(START, "step")
    _echo.add_conditional_edges("step", again, ["step", END])
    echo = _echo.compile()

    REPLY = "Hello from the fake chat model, one token at a time."


    async def model(state: State) -> dict[str, Any]:
        llm = GenericFakeChatModel(messages=iter([AIMessage(content=REPLY)]))
        return {"messages": [await llm.ainvoke(state.get("messages", []))]}


    _chat = StateGraph(State)
    _chat.add_node("model", model)
    _chat.add_edge(START, "model")
    _chat.add_edge("model", END)
    chat = _chat.compile()


    def ask(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "approve?"})
        return {"messages": [AIMessage(content=f"human said {answer}")]}


    def after(state: State) -> dict[str, Any]:
        return {"done": 1}


    _hitl = StateGraph(State)
    _hitl.add_node("ask", ask)
    _hitl.add_node("after", after)
    _hitl.add_edge(START, "ask")
    _hitl.add_edge("ask", "after")
    _hitl.add_edge("after", END)
    hitl = _hitl.compile()


    async def inner(state: State) -> dict[str, Any]:
        get_stream_writer()({"from": "inner"})
        return {"messages": [AIMessage(content="from the subgraph")], "done": 1}


    _child = StateGraph(State)
    _child.add_node("inner", inner)
    _child.add_edge(START, "inner")
    _child.add_edge("inner", END)

    _nested = StateGraph(State)
    _nested.add_node("child", _child.compile())
    _nested.add_edge(START, "child")
    _nested.add_edge("child", END)
    nested = _nested.compile()


    def boom(state: State) -> dict[str, Any]:
        raise ValueError("the graph failed on purpose")


    _broken = StateGraph(State)
    _broken.add_node("boom", boom)
    _broken.add_edge(START, "boom")
    _broken.add_edge("boom", END)
    broken = _broken.compile()
    '''
)

LEAD_NOTE = "/workspace/outputs/note.md"
LEAD_SCRIPT: dict[str, Any] = {
    "strict": True,
    "agents": {
        "lead": [
            {
                "say": "Writing the note.",
                "tool_calls": [{"name": "write_file", "args": {"path": LEAD_NOTE, "content": "hello from lead\n"}}],
                "usage": {"input": 120, "output": 30},
                "stream_chunks": 3,
            },
            {"say": f"Done: the note is at {LEAD_NOTE}.", "usage": {"input": 180, "output": 12}, "stream_chunks": 4},
        ]
    },
}

# The lead asks before writing (model "asker"); the resumed run continues (model "answered").
QUESTION_TEXT = "Who is the note for?"
ASKER_SCRIPT: dict[str, Any] = {"agents": {"lead": [{
    "say": "I need to know the audience first.",
    "tool_calls": [
        {"name": "ask_clarification", "args": {"question": QUESTION_TEXT, "options": ["team", "boss"]}},
        {"name": "write_file", "args": {"path": LEAD_NOTE, "content": "a guess\n"}},
    ],
}]}}
ANSWERED_SCRIPT: dict[str, Any] = {"agents": {"lead": [
    {"say": "Writing it for the boss.", "expect": {"contains": "The user answered: boss"},
     "tool_calls": [{"name": "write_file", "args": {"path": LEAD_NOTE, "content": "for the boss\n"}}]},
    {"say": "Done."},
]}}

# Official-server peer of the same graphs (the benchmark's comparison column).
LANGGRAPH_JSON = {"dependencies": ["."], "graphs": {name: f"./graphs.py:{name}" for name in GRAPH_NAMES}}

# Environment keys that would override the test's config file in the child.
_OVERRIDING_ENV = ("AGENTKEEL_CONFIG", "AGENTKEEL_DATABASE_URL", "AGENTKEEL_REDIS_URL")


def write_project(
    root: Path,
    *,
    database: str | None = None,
    stream: str = "memory",
    gateway: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
) -> Path:
    """Write config, graphs and script into ``root``; return the config path.

    The default database is a SQLite file in ``root``, so a restarted server reads what the
    previous one wrote.
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "graphs.py").write_text(GRAPHS_PY)
    (root / "script.yaml").write_text(yaml.safe_dump(LEAD_SCRIPT, sort_keys=False))
    (root / "asker.yaml").write_text(yaml.safe_dump(ASKER_SCRIPT, sort_keys=False))
    (root / "answered.yaml").write_text(yaml.safe_dump(ANSWERED_SCRIPT, sort_keys=False))
    config = {
        "data_dir": str(root / "data"),
        "database": database or f"sqlite:///{root / 'keel.db'}",
        "stream": stream,
        "models": [
            {"name": "scripted", "use": "scripted", "script": "script.yaml"},
            {"name": "asker", "use": "scripted", "script": "asker.yaml"},
            {"name": "answered", "use": "scripted", "script": "answered.yaml"},
        ],
        "assistants": [{"assistant_id": "lead", "model": "scripted"}],
        "graphs": {name: f"./graphs.py:{name}" for name in GRAPH_NAMES},
        "limits": {"stream_heartbeat_s": 1, "max_recursion_limit": 2000, **(limits or {})},
        "gateway": {"heartbeat_s": 1, "wait_keepalive_s": 0.5, "drain_s": 2, **(gateway or {})},
        **({"auth": auth} if auth else {}),
    }
    path = root / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def free_port() -> int:
    """A port nothing listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class KeelServer:
    """One ``keel serve`` child process; stopped by its PID, never by name."""

    config: Path
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    started_s: float = 0.0  # from spawn to the first answer of /ok
    host: str = "127.0.0.1"  # the address it listens on

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``; the exit status."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        return int(self.process.returncode)


def start_server(
    config: Path, *, port: int | None = None, host: str = "127.0.0.1", timeout: float = 40.0,
    env_extra: dict[str, str] | None = None,
) -> KeelServer:
    """Start ``python -m agentkeel.cli serve`` and return once ``/ok`` answers (``env_extra``: more
    environment for the child, such as the variables ``auth.api_keys`` names)."""
    port = port or free_port()
    log = config.parent / f"server-{port}.log"
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDING_ENV} | (env_extra or {})
    env.setdefault("PYTHONUNBUFFERED", "1")
    command = [sys.executable, "-m", "agentkeel.cli", "serve", "--config", str(config),
               "--host", host, "--port", str(port)]
    begin = time.monotonic()
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=config.parent)
    server = KeelServer(config=config, port=port, process=process, log=log, host=host)
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop(timeout=5)
        raise
    server.started_s = time.monotonic() - begin
    return server


def _wait_ready(server: KeelServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=server.url, timeout=2) as http:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"keel serve exited with {server.process.returncode}:\n{server.output()}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/ok").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"keel serve did not answer /ok within {timeout:g} s:\n{server.output()}")
            time.sleep(0.05)


# -- helpers shared by the test modules ------------------------------------------------------------
async def collect(parts: AsyncIterator[Any], timeout: float = 30.0) -> list[Any]:
    """Every part of a stream, bounded in time so a hung stream fails the test instead of the suite."""

    async def drain() -> list[Any]:
        return [part async for part in parts]

    return await asyncio.wait_for(drain(), timeout)


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 15.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(every)


async def run_reaches(client: Any, thread_id: str, run_id: str, *statuses: str, timeout: float = 15.0) -> dict[str, Any]:
    """The run once its status is one of ``statuses``."""

    async def check() -> dict[str, Any] | None:
        run = await client.runs.get(thread_id, run_id)
        return run if run["status"] in statuses else None

    return await wait_until(check, timeout)


def events(parts: list[Any]) -> list[str]:
    return [part.event for part in parts]


def slow_input(steps: int = 40, delay: float = 0.1, custom: int = 1) -> dict[str, Any]:
    return {"steps": steps, "delay": delay, "custom": custom}


@contextlib.asynccontextmanager
async def sdk(url: str, **kwargs: Any) -> AsyncIterator[Any]:
    """The official client, closed afterwards (its httpx client belongs to this event loop)."""
    from langgraph_sdk import get_client

    client = get_client(url=url, api_key=None, **kwargs)
    try:
        yield client
    finally:
        await client.aclose()

