"""An aiosqlite connection that runs its calls on the event loop's own thread.

Why: aiosqlite hands every call (cursor, execute, fetch, close, commit...) to a thread of its own and
wakes the loop when it is done. A one-statement store transaction is eight such hand-offs, about
1.5 ms of CPU spent on thread switches, the GIL and the loop's self-pipe for a statement SQLite
runs in microseconds; under ten concurrent runs the ping-pong is most of what the stores cost, and
it is what delays the next run's admission and claim. Run inline, the same transaction is a
handful of greenlet switches and never suspends the loop, so no other task can interleave with it.

Why that does not block the loop: the only thing a SQLite statement can wait for is another
connection's lock, and these connections are opened with ``busy_timeout = 0``, so a held lock
fails the statement at once with ``SQLITE_BUSY`` and ``retry_while_busy`` (below) waits
asynchronously before trying the whole transaction again: the stores' ``SqlDatabase.transaction``
(``stores/sql_engine.py``) and the checkpointer (``checkpoints/sqlite_saver.py``) both use it.
Under WAL with ``synchronous=NORMAL`` a commit does not fsync; the exception is WAL's automatic
checkpoint, which runs in the committing connection and syncs the files: the one place an inline
commit waits for the disk. So the checkpoints are a thread's work (``wal_checkpointer.py``), and
the automatic one is only a backstop, at ``BACKSTOP_PAGES``. LangGraph's key-value store keeps an
ordinary aiosqlite connection: nothing retries it, so it waits in SQLite's busy handler, which
belongs on a thread.

SQLAlchemy's aiosqlite dialect drives this class unchanged (``async_creator``): every call, and
the few the dialect queues on ``_tx`` directly (setting ``isolation_level``), complete before the
awaitable is awaited, so awaiting it never yields.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiosqlite

from agentkeel.runtime.wal_checkpointer import BACKSTOP_PAGES

log = logging.getLogger(__name__)
T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 10_000  # how long a busy database is waited out before backing off
BUSY_POLL_S = (0.001, 0.025)  # waiting out another connection's lock: first poll, cap (doubling)
BUSY_RETRIES = 5  # after SQLITE_BUSY_TIMEOUT_MS of polling; attempts beyond the first
BUSY_BACKOFF_S = (0.05, 1.0)  # initial, cap; doubles per attempt, with jitter


def inline_pragmas() -> list[str]:
    """How an inline connection is set up (the stores' and the checkpointer's alike): WAL with
    ``synchronous = NORMAL``; ``busy_timeout`` first, because switching to WAL needs a lock another
    process may hold (a new connection is rare, so that one wait may block), then 0, so that from
    then on a held lock fails at once and ``retry_while_busy`` waits for it asynchronously."""
    return [
        f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}",
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = NORMAL",
        f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}",  # a backstop: a thread checkpoints (wal_checkpointer.py)
        "PRAGMA busy_timeout = 0",
    ]


def is_busy(exc: BaseException) -> bool:
    """Another connection holds the lock SQLite needed (``SQLITE_BUSY``/``SQLITE_LOCKED``).

    Takes the driver's error or SQLAlchemy's wrapper of it (``.orig``).
    """
    orig = getattr(exc, "orig", exc)
    if not isinstance(orig, sqlite3.OperationalError):
        return False
    if (getattr(orig, "sqlite_errorname", None) or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return True
    message = str(orig).lower()
    return "database is locked" in message or "database is busy" in message


async def retry_while_busy(
    attempt: Callable[[], Awaitable[T]], *, after_busy: Callable[[], Awaitable[None]] | None = None
) -> T:
    """Run ``attempt`` (one whole transaction) again while SQLite reports busy.

    ``attempt`` must leave nothing behind when it fails busy (its transaction rolled back), or
    ``after_busy`` must clean up. For the first ``SQLITE_BUSY_TIMEOUT_MS`` the retries poll
    quickly and quietly (what SQLite's busy handler does, without holding the loop); then
    ``BUSY_RETRIES`` more with a backoff, each logged; then the busy error is raised.
    """
    delay, cap = BUSY_BACKOFF_S
    retries = 0
    poll = BUSY_POLL_S[0]
    waiting_until = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not is_busy(exc):
                raise
            if after_busy is not None:
                await after_busy()
            left = waiting_until - time.monotonic()
            if left > 0:
                await asyncio.sleep(min(poll, left))
                poll = min(poll * 2, BUSY_POLL_S[1])
                continue
            if retries == BUSY_RETRIES:
                raise
            retries += 1
            log.warning("database busy (attempt %d), retrying: %s", retries, getattr(exc, "orig", exc))
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, cap)


class _RunNow:
    """Stands in for aiosqlite's queue to its thread: runs each queued call at once."""

    def put_nowait(self, item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except BaseException as exc:  # handed to the awaiting caller, as aiosqlite's thread does
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        if future is not None and not future.done():
            future.set_result(result)


class InlineConnection(aiosqlite.Connection):
    """``aiosqlite.Connection`` without its thread (see the module docstring)."""

    def __init__(self, connector: Callable[[], sqlite3.Connection]) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self._tx = _RunNow()  # type: ignore[assignment]

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)

    def __await__(self) -> Generator[Any, None, aiosqlite.Connection]:
        return self._connect().__await__()  # no thread to start


async def connect_inline(
    path: Path, *, isolation_level: Literal["DEFERRED"] | None = None
) -> InlineConnection:
    """An inline connection to the SQLite file ``path``; by default in autocommit mode, as the
    stores emit their own ``BEGIN`` (``stores/sql_engine.py``). ``"DEFERRED"`` keeps the
    driver's implicit ``BEGIN`` before a write, which LangGraph's saver relies on."""

    def connector() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=isolation_level, check_same_thread=False)

    connection = InlineConnection(connector)
    await connection
    return connection
