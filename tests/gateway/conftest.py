"""Fixtures of the gateway tests that need a real ``keel serve`` process (see ``server_support``).

Why a conftest: a session-scoped fixture is shared across modules only when it is defined once
here; imported into each module it would start one server per module. A module that defines or
imports its own ``client`` fixture (the in-process tests here do) overrides the SDK one below.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # server_support, whichever import mode pytest uses

from server_support import KeelServer, sdk, start_server, write_project


@pytest.fixture(scope="session")
def keel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    """The shared server: SQLite file database, in-memory stream bridge."""
    server = start_server(write_project(tmp_path_factory.mktemp("keel-sqlite")))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keel_server_pg(tmp_path_factory: pytest.TempPathFactory, pg_url: str, redis_url: str) -> Iterator[KeelServer]:
    """A server on PostgreSQL and the Redis stream bridge (skips without the services).

    Its own database, dropped afterwards: the server's runtime must not share tables with the
    runtime tests that use ``pg_url`` later in the session.
    """
    import psycopg

    name = f"keel_gw_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        database = f"{pg_url.rsplit('/', 1)[0]}/{name}"
        server = start_server(write_project(tmp_path_factory.mktemp("keel-pg"), database=database, stream=redis_url))
        yield server
        server.stop()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def client(keel_server: KeelServer) -> AsyncIterator[Any]:
    """The official ``langgraph-sdk`` async client pointed at the shared server."""
    async with sdk(keel_server.url) as c:
        yield c
