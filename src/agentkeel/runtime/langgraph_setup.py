"""LangGraph's ``setup()`` (checkpointer, key-value store) one process at a time.

Why: those migrations are not safe to run concurrently. Processes starting together on a fresh
database (a gateway and two workers, say) all read "not migrated yet" and all migrate, and the
losers' start-up fails. The run stores' migrations have their own lock (``stores/sql_engine.py``).

* PostgreSQL: they race on ``CREATE TABLE`` (a ``UniqueViolation`` on ``pg_type``) and on
  ``CREATE INDEX CONCURRENTLY`` (``deadlock detected``). A session-level advisory lock on the
  setup's own connection serialises them. It is taken with ``pg_try_advisory_lock`` in a loop, not
  ``pg_advisory_lock``: a session blocked inside ``pg_advisory_lock`` is a running transaction,
  which the holder's concurrent index build waits for — a wait PostgreSQL does not see as a
  deadlock, so both would hang.
* SQLite: the key-value store reads its ``store_migrations`` version and then applies the newer
  migrations in autocommit, so two processes both run ``ALTER TABLE store ADD COLUMN expires_at``
  (``duplicate column name``) or both record a version (``UNIQUE constraint failed``). An
  exclusive ``flock`` on a lock file beside the database (``<db>.migrate.lock``) serialises them;
  the next holder re-reads the version and has nothing left to do. A transaction cannot be the
  lock: on the setup's own connection, ``executescript`` commits any open transaction before its
  first statement (releasing the lock mid-migration), and a write lock held on a second
  connection would block the setup's own writes (SQLite has one writer) until they time out.
  The kernel drops a ``flock`` when its holder dies, so a crashed process leaves no stale lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

# An arbitrary constant key: "LangGraph's setup() runs one process at a time".
PG_LANGGRAPH_SETUP_LOCK = 0x6B65656C4C47  # "keelLG"
POLL_S = 0.05


@contextlib.asynccontextmanager
async def serialized_setup(conn: Any) -> AsyncIterator[None]:
    """Hold the setup lock on ``conn`` (an autocommit psycopg connection) for the block."""
    while not (await (await conn.execute(
        "SELECT pg_try_advisory_lock(%s)", (PG_LANGGRAPH_SETUP_LOCK,)
    )).fetchone())[0]:
        await asyncio.sleep(POLL_S)
    try:
        yield
    finally:
        if not conn.closed:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (PG_LANGGRAPH_SETUP_LOCK,))


@contextlib.asynccontextmanager
async def serialized_sqlite_setup(db: Path) -> AsyncIterator[None]:
    """Hold the setup lock of the SQLite database at ``db`` for the block.

    Polled with ``LOCK_NB`` rather than blocking in a thread, so the event loop stays free and a
    cancelled wait leaves nothing behind that could take the lock later.
    """
    fd = os.open(db.with_name(f"{db.name}.migrate.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


__all__ = ["serialized_setup", "serialized_sqlite_setup"]
