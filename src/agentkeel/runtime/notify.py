"""Wake-ups between the processes of a deployment: a run was admitted, a thread was freed, a
control request (cancel, interrupt, rollback) was stored for a run.

A notification is only a wake-up; the run store is the truth. A lost notification costs latency,
never correctness: every listener also re-reads the store on a timer (the claim sweep and the lease
renewals), and a listener that reconnects wakes itself because it may have missed some.

``Notifier`` itself fans out inside one process (the memory store, and SQLite, which has no way to
signal another process: workers there fall back to a short poll). ``PgNotifier`` uses PostgreSQL's
``LISTEN``/``NOTIFY``: sending goes through the stores' own connections (``pg_notify`` inside an
ordinary statement), listening holds one dedicated connection, reconnecting with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkeel.runtime.connections import Connections

log = logging.getLogger(__name__)

WAKE = "wake"  # a run became claimable: admitted, or its thread was freed
CONTROL = "control"  # a control request was stored for run ``run_id``

Listener = Callable[[str, str], None]
CHANNEL = "agentkeel"
RECONNECT_BACKOFF_S = (0.5, 10.0)


class Notifier:
    """In-process fan-out; the base of the cross-process notifiers."""

    cross_process = False

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Begin receiving other processes' notifications (nothing to do in-process)."""

    async def close(self) -> None:
        self._listeners.clear()

    async def notify(self, topic: str, run_id: str = "") -> None:
        """Wake every listener of this process, and of the others where the backend reaches them.

        Never raises: a failed wake-up is logged and left to the listeners' timers.
        """
        self._deliver(topic, run_id)

    def _deliver(self, topic: str, run_id: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(topic, run_id)
            except Exception:
                log.exception("notification listener failed on %s %s", topic, run_id)



class PgNotifier(Notifier):
    """``LISTEN``/``NOTIFY`` on channel ``agentkeel``; payload ``<topic>:<run_id>``.

    ``send`` runs ``SELECT pg_notify(channel, payload)`` on the stores' pool; ``conninfo`` opens the
    one dedicated listening connection. Our own notifications come back through PostgreSQL like
    everyone else's, so local listeners are woken once, by the listener loop.
    """

    cross_process = True

    def __init__(self, conninfo: str, send: Callable[[str, str], Awaitable[None]]) -> None:
        super().__init__()
        self._conninfo = conninfo
        self._send = send
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen_forever(), name="agentkeel-pg-listen")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), timeout=5)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await super().close()

    async def notify(self, topic: str, run_id: str = "") -> None:
        try:
            await self._send(CHANNEL, f"{topic}:{run_id}")
        except Exception as exc:
            log.warning("NOTIFY %s %s failed (listeners' timers cover it): %r", topic, run_id, exc)
            self._deliver(topic, run_id)  # at least this process hears it now

    async def _listen_forever(self) -> None:
        import psycopg

        delay, cap = RECONNECT_BACKOFF_S
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, application_name="agentkeel-listen"
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._connected.set()
                    delay = RECONNECT_BACKOFF_S[0]
                    self._deliver(WAKE, "")  # anything sent while we were not listening
                    async for message in conn.notifies():
                        topic, _, run_id = message.payload.partition(":")
                        self._deliver(topic, run_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection lost, reconnecting in %.1f s: %r", delay, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)


def open_notifier(connections: Connections, store: object) -> Notifier:
    """PostgreSQL's LISTEN/NOTIFY when the run store is on PostgreSQL, else in-process.

    The listening connection is opened from the connection layer's ``conninfo``: the URL's
    parameters and the ``database_pool`` timeouts and keepalives, outside the pool.
    """
    from agentkeel.runtime.stores.sql import SqlRunStore

    if isinstance(store, SqlRunStore) and connections.pool is not None:
        return PgNotifier(connections.conninfo, store.pg_notify)
    return Notifier()


__all__ = ["CONTROL", "WAKE", "Notifier", "PgNotifier", "open_notifier"]
