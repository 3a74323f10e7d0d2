"""Helpers for the run-lifecycle integration suite (``tests/runtime/test_runtime_*.py``).

The fixtures that use them live in ``tests/runtime/conftest.py``: ``keel_backend`` (which database
and stream bridge a test runs on, parametrised with :data:`FULL_MATRIX` or :data:`LIGHT_MATRIX`)
and ``keel`` (a :class:`Keel` factory that writes scripts, builds configs and opens runtimes).

Everything here goes through the public control plane: ``open_runtime``, ``RunManager``,
``observe``, the stores and ``StateAccessor``. Waits are bounded, so a hang fails the test
instead of the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import StateSnapshot

from agentkeel.config import KeelConfig
from agentkeel.database import Database
from agentkeel.runtime.bridge import StreamEvent
from agentkeel.runtime.checkpoints import StateAccessor, open_checkpointer
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.observe import observe
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.sandbox.workspace import Workspace

# -- backends ---------------------------------------------------------------------------------

DATABASES = ("memory", "sqlite", "postgres")
STREAMS = ("memory", "redis")


@dataclass(frozen=True)
class Backend:
    database: str  # memory | sqlite | postgres
    stream: str  # memory | redis
    database_url: str
    stream_url: str

    @property
    def label(self) -> str:
        return f"{self.database}-{self.stream}"


def _param(database: str, stream: str) -> Any:
    marks = []
    if database == "postgres":
        marks.append(pytest.mark.postgres)
    if stream == "redis":
        marks.append(pytest.mark.redis)
    return pytest.param((database, stream), id=f"{database}-{stream}", marks=marks)


FULL_MATRIX = [_param(d, s) for d in DATABASES for s in STREAMS]
"""Every database x every stream bridge: for the behaviour the backends implement (admission,
queueing, cancellation, rollback, END and replay)."""

DATABASE_MATRIX = [_param(d, "memory") for d in DATABASES]
"""Every database with the memory bridge: for store-enforced rules (fencing)."""

LIGHT_MATRIX = [_param("memory", "memory"), _param("sqlite", "memory")]
"""memory:// and SQLite: for behaviour that does not depend on the backends."""


def backend_matrix(matrix: list[Any]) -> pytest.MarkDecorator:
    """``@backend_matrix(FULL_MATRIX)``: run the test (or module) on each of those backends."""
    return pytest.mark.parametrize("keel_backend", matrix, indirect=True)


@contextlib.asynccontextmanager
async def checkpointer_on(url: str) -> AsyncIterator[BaseCheckpointSaver]:
    """A ready checkpointer on ``url``, without the rest of a runtime."""
    async with open_connections(Database.parse(url)) as connections, open_checkpointer(connections) as saver:
        yield saver


# -- scripts and configs ----------------------------------------------------------------------


def turn(
    say: str | None = None,
    *calls: dict[str, Any],
    usage: tuple[int, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One scripted model turn (``docs/scripted-model.md``)."""
    entry: dict[str, Any] = dict(extra)
    if say is not None:
        entry["say"] = say
    if calls:
        entry["tool_calls"] = list(calls)
    if usage is not None:
        entry["usage"] = {"input": usage[0], "output": usage[1]}
    return entry


def call(name: str, call_id: str | None = None, **args: Any) -> dict[str, Any]:
    """A scripted tool call."""
    out: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        out["id"] = call_id
    return out


# For tests about something else (rollback, lifecycle accounting) whose scripts edit files they
# never read: the read-before-write gate would rightly refuse those edits.
UNGATED = {"read_before_write": {"enabled": False}}
# For tests about how a provider failure is reported: one attempt, no retry backoff.
NO_RETRY = {"llm_retry": {"max_attempts": 1}}

# Shared scripts: each run replays its model's script from turn 1.
FAST = [turn("All done.", usage=(10, 2))]
SLOW = [turn("Too late.", delay_ms=20_000)]


def new_thread_id(label: str = "t") -> str:
    """Unique per test: the PostgreSQL database is shared by the whole session."""
    return f"{label}-{uuid.uuid4().hex[:10]}"


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


class Keel:
    """Builds configs on the test's backend and opens runtimes from them."""

    def __init__(self, backend: Backend, tmp_path: Path) -> None:
        self.backend = backend
        self.tmp_path = tmp_path
        self._scripts = 0

    def script(self, turns: list[dict[str, Any]] | dict[str, list[dict[str, Any]]], agent: str = "lead",
               **top: Any) -> str:
        """Write a script file (agent ``agent`` plays ``turns``, or ``turns`` maps agent names to
        their lists); returns its path."""
        self._scripts += 1
        path = self.tmp_path / f"script_{self._scripts}.yaml"
        agents = turns if isinstance(turns, dict) else {agent: turns}
        path.write_text(yaml.safe_dump({**top, "agents": agents}, sort_keys=False))
        return str(path)

    def config(
        self,
        models: dict[str, list[dict[str, Any]] | dict[str, list[dict[str, Any]]]] | None = None,
        *,
        limits: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> KeelConfig:
        """A config on this backend; ``models`` maps model names to their lead scripts, or to their
        agents' lists (``{"lead": [...], "summarization": [...]}``); the first is every assistant's
        default."""
        models = models or {"fast": FAST}
        raw: dict[str, Any] = {
            "data_dir": str(self.tmp_path / "data"),
            "database": self.backend.database_url,
            "stream": self.backend.stream_url,
            "models": [
                {"name": name, "use": "scripted", "script": self.script(turns)}
                for name, turns in models.items()
            ],
            # Short heartbeats keep observers responsive; the TTL only has to outlive the test.
            "limits": {"stream_heartbeat_s": 0.2, "stream_ttl_s": 600, **(limits or {})},
        }
        raw.update(overrides)
        return KeelConfig(**raw, base_dir=self.tmp_path)

    @contextlib.asynccontextmanager
    async def open(self, config: KeelConfig | None = None, **kwargs: Any) -> AsyncIterator[Runtime]:
        async with open_runtime(config or self.config(), **kwargs) as runtime:
            yield runtime


# -- waiting ----------------------------------------------------------------------------------


async def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or predicate}")
        await asyncio.sleep(interval)


async def wait_status(rt: Runtime, run_id: str, *statuses: RunStatus, timeout: float = 10.0) -> RunRecord:
    async def check() -> RunRecord | None:
        record = await rt.store.get(run_id)
        return record if record is not None and record.status in statuses else None

    return await wait_until(check, timeout, what=f"run {run_id} to be {[s.value for s in statuses]}")


async def finished(rt: Runtime, run_id: str, timeout: float = 15.0) -> RunRecord:
    """Wait for a run this process executes to finish; its stored record."""
    async with asyncio.timeout(timeout):
        record = await rt.manager.wait(run_id)
    assert record is not None, f"run {run_id} was deleted"
    return record


async def finished_and_deleted(rt: Runtime, run_id: str, timeout: float = 15.0) -> None:
    """Wait for a run to finish and check that it deleted itself (a rollback)."""
    async with asyncio.timeout(timeout):
        record = await rt.manager.wait(run_id)
    assert record is None, f"run {run_id} still exists: {record}"


async def stored(rt: Runtime, run_id: str) -> RunRecord:
    record = await rt.store.get(run_id)
    assert record is not None, f"run {run_id} is not stored"
    return record


async def thread_status(rt: Runtime, thread_id: str) -> str:
    thread = await rt.store.get_thread(thread_id)
    assert thread is not None, f"thread {thread_id} is not stored"
    return thread.status


async def start(rt: Runtime, thread_id: str, input: Any = "hello", **kwargs: Any) -> RunRecord:
    return await rt.manager.create(RunRequest(thread_id=thread_id, input=input, **kwargs))


async def run_to_end(rt: Runtime, thread_id: str, input: Any = "hello", **kwargs: Any) -> RunRecord:
    record = await start(rt, thread_id, input, **kwargs)
    return await finished(rt, record.run_id)


# -- reading what a run left ------------------------------------------------------------------


async def stream_events(
    rt: Runtime, run_id: str, last_event_id: str | None = "-1", timeout: float = 10.0, **kwargs: Any
) -> list[StreamEvent]:
    """Everything ``observe`` yields for the run (up to and including END), bounded in time."""
    items: list[StreamEvent] = []
    async with asyncio.timeout(timeout):
        stream = cast(AsyncGenerator[StreamEvent, None], observe(rt, run_id, last_event_id=last_event_id, **kwargs))
        async with contextlib.aclosing(stream) as events:
            async for item in events:
                items.append(item)
    return items


def data_events(items: list[StreamEvent], name: str | None = None) -> list[StreamEvent]:
    return [i for i in items if i.id and (name is None or i.event == name)]


async def journal(rt: Runtime, run_id: str) -> list[JournalEvent]:
    return await rt.journal.list(run_id)


async def accessor(rt: Runtime, assistant_id: str = "lead") -> StateAccessor:
    """A ``StateAccessor`` over the assistant's graph, as the worker builds it."""
    graph = await rt.harness.state_graph(rt.harness.resolve(assistant_id), {"metadata": {}})
    return StateAccessor(graph, rt.checkpointer)


async def thread_state(rt: Runtime, thread_id: str) -> StateSnapshot:
    snapshot = await (await accessor(rt)).aget(thread_id)
    assert snapshot is not None, f"thread {thread_id} has no checkpoint"
    return snapshot


async def thread_messages(rt: Runtime, thread_id: str) -> list[BaseMessage]:
    snapshot = await (await accessor(rt)).aget(thread_id)
    return [] if snapshot is None else list(snapshot.values.get("messages", []))


def describe(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    """(type, text) per message: compact, comparable, and readable in a failure diff."""
    return [(m.type, m.content if isinstance(m.content, str) else str(m.content)) for m in messages]


def workspace(config: KeelConfig, thread_id: str) -> Path:
    """The thread's real workspace root (created with outputs/ and uploads/)."""
    return Workspace.for_thread(config.data_path, thread_id).real_root


async def poll_gone(pid: int, timeout: float = 2.0) -> float:
    """Seconds until process ``pid`` and its process group no longer exist (or AssertionError)."""
    import os

    began = time.monotonic()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pass
        else:
            return False
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await wait_until(gone, timeout, interval=0.02, what=f"process group {pid} to disappear")
    return time.monotonic() - began


Hook = Callable[[RunRecord], Awaitable[None]]


def recording_hook(seen: list[RunRecord]) -> Hook:
    async def hook(record: RunRecord) -> None:
        seen.append(record)

    return hook


def lead_requests(sent: list[tuple[str, list[BaseMessage]]]) -> list[list[BaseMessage]]:
    return [messages for agent, messages in sent if agent == "lead"]
