"""LangGraph's ``setup()`` (checkpointer, key-value store) one process at a time on PostgreSQL.

Why: those migrations are not safe to run concurrently. Processes starting together on a fresh
database (a gateway and two workers, say) race on ``CREATE TABLE`` (a ``UniqueViolation`` on
``pg_type``) and on ``CREATE INDEX CONCURRENTLY`` (``deadlock detected``), and the loser's start-up
fails. A session-level advisory lock on the setup's own connection serialises them; the run
stores' migrations have their own lock.

The lock is taken with ``pg_try_advisory_lock`` in a loop, not ``pg_advisory_lock``: a session
blocked inside ``pg_advisory_lock`` is a running transaction, which the holder's concurrent index
build waits for — a wait PostgreSQL does not see as a deadlock, so both would hang.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
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


__all__ = ["serialized_setup"]
