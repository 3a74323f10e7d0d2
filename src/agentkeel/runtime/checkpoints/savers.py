"""Opening the LangGraph checkpointer for a database URL.

The checkpointer shares the runtime's one database URL; LangGraph's tables (``checkpoints``,
``writes``, ``checkpoint_blobs``, ...) live beside the run and journal stores' own tables. Each
backend is opened with the settings that matter for a long-running multi-process runtime:

* SQLite: WAL, so readers (the gateway reading state) never block the run writing checkpoints, and
  a busy timeout, because the run stores write to the same file from their own connections.
* PostgreSQL: a pool in autocommit (the saver's ``setup()`` runs ``CREATE INDEX CONCURRENTLY``,
  and each saver call is its own unit of work), ``prepare_threshold=0`` (server-side prepared
  statements break behind transaction-pooling proxies such as PgBouncer), ``dict_row`` (what the
  saver's queries expect), TCP keepalives and a checkout check so a connection dropped by the
  network is replaced instead of failing the next run's first checkpoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_POOL_MAX_SIZE = 10


@asynccontextmanager
async def open_checkpointer(database_url: str) -> AsyncIterator[BaseCheckpointSaver]:
    """Yield a ready (``setup()`` done) async saver for ``database_url``; close it on exit.

    ``memory://`` → ``InMemorySaver``; ``sqlite:///relative/path`` or ``sqlite:////abs/path`` (also
    ``sqlite+aiosqlite://``) → ``AsyncSqliteSaver``; ``postgresql://`` / ``postgres://`` (also
    ``postgresql+psycopg://``) → ``AsyncPostgresSaver`` on a connection pool.
    """
    scheme, sep, rest = database_url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {database_url!r}")
    scheme = scheme.lower()
    if scheme == "memory":
        yield InMemorySaver()
    elif scheme in ("sqlite", "sqlite+aiosqlite"):
        async with _open_sqlite(_sqlite_path(database_url, rest)) as saver:
            yield saver
    elif scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        async with _open_postgres(f"postgresql://{rest}") as saver:
            yield saver
    else:
        raise ValueError(
            f"unsupported checkpoint database scheme {scheme!r} in {database_url!r} "
            "(use memory://, sqlite:///path or postgresql://...)"
        )


def _sqlite_path(database_url: str, rest: str) -> str:
    # sqlite:///<path>: an empty host, then the path (absolute paths keep their own leading "/").
    if not rest.startswith("/") or len(rest) < 2 or "?" in rest:
        raise ValueError(
            f"expected sqlite:///<path> without query parameters, got {database_url!r}"
        )
    return rest[1:]


@asynccontextmanager
async def _open_sqlite(path: str) -> AsyncIterator[BaseCheckpointSaver]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    async with aiosqlite.connect(path) as conn:
        await conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL survives a process crash (only power loss can drop the last commits),
        # the same durability the run and journal stores use; FULL costs ~5 ms per step.
        await conn.execute("PRAGMA synchronous = NORMAL")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        yield saver


@asynccontextmanager
async def _open_postgres(url: str) -> AsyncIterator[BaseCheckpointSaver]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
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
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver
    finally:
        await pool.close()


__all__ = ["open_checkpointer"]
