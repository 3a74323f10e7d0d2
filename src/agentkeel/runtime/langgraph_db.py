"""Connections for LangGraph's own persistence (checkpointer, key-value store) from the runtime's
one database URL.

Both are opened with the settings that matter for a long-running multi-process runtime:

* SQLite: WAL, so readers (the gateway reading state) never block a run writing checkpoints; a busy
  timeout, because the run stores write to the same file from their own connections; and
  ``synchronous=NORMAL``, which under WAL survives a process crash (only power loss can drop the
  last commits) — the durability the run and journal stores use — where FULL costs ~5 ms a step.
* PostgreSQL: a pool in autocommit (``setup()`` runs ``CREATE INDEX CONCURRENTLY``, and each call is
  its own unit of work), ``prepare_threshold=0`` (server-side prepared statements break behind
  transaction-pooling proxies such as PgBouncer), ``dict_row`` (what LangGraph's queries expect),
  TCP keepalives and a checkout check, so a connection the network dropped is replaced instead of
  failing the next call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_POOL_MAX_SIZE = 10

Backend = Literal["memory", "sqlite", "postgres"]


def parse_database_url(database_url: str, what: str) -> tuple[Backend, str]:
    """``(backend, target)``: target is the SQLite file path or a ``postgresql://`` URL."""
    scheme, sep, rest = database_url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {database_url!r}")
    scheme = scheme.lower()
    if scheme == "memory":
        return "memory", ""
    if scheme in ("sqlite", "sqlite+aiosqlite"):
        # sqlite:///<path>: an empty host, then the path (absolute paths keep their leading "/").
        if not rest.startswith("/") or len(rest) < 2 or "?" in rest:
            raise ValueError(f"expected sqlite:///<path> without query parameters, got {database_url!r}")
        return "sqlite", rest[1:]
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return "postgres", f"postgresql://{rest}"
    raise ValueError(
        f"unsupported {what} database scheme {scheme!r} in {database_url!r} "
        "(use memory://, sqlite:///path or postgresql://...)"
    )


@asynccontextmanager
async def sqlite_connection(path: str, **connect_kwargs: Any) -> AsyncIterator[Any]:
    import aiosqlite

    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    async with aiosqlite.connect(path, **connect_kwargs) as conn:
        await conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA synchronous = NORMAL")
        yield conn


@asynccontextmanager
async def postgres_pool(url: str) -> AsyncIterator[Any]:
    from psycopg import AsyncConnection
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[AsyncConnection[dict[str, Any]]] = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=PG_POOL_MAX_SIZE,
        open=False,
        check=AsyncConnectionPool.check_connection,
        kwargs={
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
            "keepalives": 1,
            "keepalives_idle": 60,
            "keepalives_interval": 10,
            "keepalives_count": 6,
        },
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()
