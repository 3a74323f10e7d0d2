"""Shared fixtures: real PostgreSQL and Redis, isolated per test run.

Tests that need a service skip with a clear reason when it is absent, unless
``AGENTKEEL_REQUIRE_SERVICES=1`` (set by ``.ci/run``), under which its absence is a failure.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator

import pytest

PG_ADMIN_URL = os.environ.get("AGENTKEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("AGENTKEEL_TEST_REDIS", "redis://127.0.0.1:6379/0")
REQUIRE_SERVICES = os.environ.get("AGENTKEEL_REQUIRE_SERVICES") == "1"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def service_unavailable(name: str, reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"{name} is required (AGENTKEEL_REQUIRE_SERVICES=1) but unavailable: {reason}")
    pytest.skip(f"{name} unavailable: {reason}")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test run, dropped afterwards."""
    if not _reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL", "nothing listens on 127.0.0.1:5432")
    import psycopg

    name = f"keel_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL", str(exc))
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """A new, empty PostgreSQL database, dropped afterwards (request ``pg_url`` first: it checks
    the server is there)."""
    import psycopg

    name = f"keel_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_pg_url(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one test (for schema/migration tests)."""
    with scratch_database() as url:
        yield url


@pytest.fixture(scope="module")
def module_pg_url(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database shared by one module's tests (one expensive set-up, checked by
    several tests)."""
    with scratch_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> str:
    if not _reachable("127.0.0.1", 6379):
        service_unavailable("Redis", "nothing listens on 127.0.0.1:6379")
    return REDIS_URL


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix unique to one test, so parallel runs and reruns never see each other's keys."""
    return f"keeltest:{uuid.uuid4().hex[:10]}"
