"""An aiosqlite connection that runs its calls on the event loop's own thread.

Why: aiosqlite hands every call (cursor, execute, fetch, close, commit...) to a thread of its own and
wakes the loop when it is done. A one-statement store transaction is eight such hand-offs, about
1.5 ms of CPU spent on thread switches, the GIL and the loop's self-pipe for a statement SQLite
runs in microseconds; under ten concurrent runs the ping-pong is most of what the stores cost, and
it is what delays the next run's admission and claim. Run inline, the same transaction is a
handful of greenlet switches and never suspends the loop, so no other task can interleave with it.

Why that does not block the loop: the only thing a SQLite statement can wait for is another
connection's lock, and the stores open these connections with ``busy_timeout = 0``, so a held lock
fails the statement at once with ``SQLITE_BUSY`` and ``SqlDatabase.transaction`` waits
asynchronously before trying again (``stores/sql_engine.py``). Under WAL with
``synchronous=NORMAL`` a commit does not fsync. LangGraph's saver and store keep ordinary aiosqlite
connections: they do not retry a busy database, so they must wait in SQLite's busy handler, which
belongs on a thread.

SQLAlchemy's aiosqlite dialect drives this class unchanged (``async_creator``): every call, and
the few the dialect queues on ``_tx`` directly (setting ``isolation_level``), complete before the
awaitable is awaited, so awaiting it never yields.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import aiosqlite


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


async def connect_inline(path: Path) -> InlineConnection:
    """An inline connection to the SQLite file ``path`` in autocommit mode: the stores emit their
    own ``BEGIN`` (``stores/sql_engine.py``)."""

    def connector() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    connection = InlineConnection(connector)
    await connection
    return connection
