"""Fixtures of the run-lifecycle integration suite (helpers in ``runtime_support.py``).

``keel_backend`` is parametrised indirectly (``@backend_matrix(FULL_MATRIX)``); unparametrised it
is memory:// with the memory bridge. PostgreSQL and Redis come from the session fixtures in
``tests/conftest.py``, requested only by the parameters that need them, so they skip (or fail
under ``AGENTKEEL_REQUIRE_SERVICES=1``) exactly where they are used.

Isolation: each test gets its own SQLite file and data directory (``tmp_path``). On PostgreSQL each
test module gets a database of its own (``module_pg_url``), and its tests use unique thread ids (run
ids are UUIDs): a runtime's worker claims every startable run of its database, so a run another
module left pending (or running, under an expired lease) would otherwise be claimed, or recovered,
by the next module's runtime. Whatever ``stream_prefix`` a
test's config names, ``keel`` wraps ``open_bridge`` so Redis keys use the test's own
``redis_prefix``, and deletes the test's keys afterwards.

The checkpoint mode is frozen per process; ``keel`` un-freezes it for the test (and restores the
previous value after), so each test's config decides its mode, delta included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from runtime_support import Backend, Keel

import agentkeel.runtime.runtime as runtime_module
from agentkeel.harness.scripted.model import ScriptedChatModel
from agentkeel.runtime.bridge import open_bridge
from agentkeel.runtime.checkpoints import mode as mode_module


@pytest.fixture
def keel_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    database, stream = getattr(request, "param", ("memory", "memory"))
    if database == "memory":
        database_url = "memory://"
    elif database == "sqlite":
        database_url = f"sqlite:///{tmp_path / 'db' / 'keel.db'}"
    elif database == "postgres":
        database_url = request.getfixturevalue("module_pg_url")
    else:
        raise ValueError(database)
    stream_url = "memory" if stream == "memory" else request.getfixturevalue("redis_url")
    return Backend(database, stream, database_url, stream_url)


@pytest.fixture
async def keel(
    keel_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[Keel]:
    monkeypatch.setattr(mode_module, "_frozen", None)
    prefix = None
    if keel_backend.stream == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        def isolated(*args: object, **kwargs: object) -> object:
            return open_bridge(*args, **{**kwargs, "prefix": prefix})  # type: ignore[arg-type]

        monkeypatch.setattr(runtime_module, "open_bridge", isolated)
    yield Keel(keel_backend, tmp_path)
    if prefix is not None:
        from redis.asyncio import Redis

        client = Redis.from_url(keel_backend.stream_url, decode_responses=True)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[BaseMessage]]]:
    """Every request a scripted model answers, as it received it: (agent, messages)."""
    seen: list[tuple[str, list[BaseMessage]]] = []
    original = ScriptedChatModel._reply

    def spy(self: ScriptedChatModel, call: Any, messages: Any) -> Any:
        seen.append((call.agent, list(messages)))
        return original(self, call, messages)

    monkeypatch.setattr(ScriptedChatModel, "_reply", spy)
    return seen
