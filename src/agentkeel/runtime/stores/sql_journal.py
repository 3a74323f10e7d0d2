"""The SQL journal store (SQLite and PostgreSQL), sharing the run store's database.

The journal has no foreign key to ``runs``: a late writer's append must never fail because its run
was deleted meanwhile. ``SqlRunStore.delete_run``/``delete_thread`` remove events explicitly, in
the same transaction as the rows they belong to.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import RowMapping

from agentkeel.runtime.records import utcnow
from agentkeel.runtime.stores.base import JournalEvent, JournalStore
from agentkeel.runtime.stores.sql_engine import SqlBacked, SqlDatabase
from agentkeel.runtime.stores.sql_schema import journal


def _to_event(row: RowMapping) -> JournalEvent:
    return JournalEvent(
        run_id=row["run_id"],
        thread_id=row["thread_id"],
        seq=row["seq"],
        kind=row["kind"],
        data=row["data"],
        caller=row["caller"],
        ts=row["ts"],
        attempt=row["attempt"],
        step=row["step"],
    )


def event_row(e: JournalEvent, now: datetime) -> dict[str, Any]:
    """The ``journal`` row of one event (also what ``RunStore.finish`` inserts for ``run.end``)."""
    return {"run_id": e.run_id, "seq": e.seq, "thread_id": e.thread_id, "kind": e.kind, "caller": e.caller,
            "data": e.data, "ts": e.ts or now, "attempt": e.attempt, "step": e.step}


class SqlJournalStore(SqlBacked, JournalStore):
    """Appends are group-committed: an append that finds no write in flight writes at once (on
    SQLite without a single suspension); what the runs of this process append while a write is in
    flight is written right after it, all together, in one transaction -- so runs journaling at
    once cost one commit, not one each.
    Each caller still returns only once its own events are stored, and gets the error if they were
    not: a group write that fails is retried per caller, so one caller's failure is never another's."""

    def __init__(self, db: SqlDatabase) -> None:
        super().__init__(db)
        self._pending: list[tuple[list[JournalEvent], asyncio.Future[None]]] = []
        self._writing: asyncio.AbstractEventLoop | None = None  # the loop a write is in flight on

    async def append(self, events: list[JournalEvent]) -> None:
        """Store the batch; a ``(run_id, seq)`` already stored is skipped."""
        if not events:
            return
        loop = asyncio.get_running_loop()
        if self._writing is loop:  # join the group written after the write in flight
            done = loop.create_future()
            done.add_done_callback(_retrieve)  # a cancelled caller leaves no "never retrieved" warning
            self._pending.append((list(events), done))
            # Shielded: a caller cancelled while waiting must not cancel the others' write.
            await asyncio.shield(done)
            return
        self._writing = loop
        try:
            await self._insert(events)
        finally:
            if self._pending:
                loop.create_task(self._write_pending())  # it clears ``_writing`` when done
            else:
                self._writing = None

    async def _write_pending(self) -> None:
        try:
            while self._pending:
                group, self._pending = self._pending, []
                try:
                    await self._insert([e for events, _ in group for e in events])
                except Exception as exc:
                    if len(group) == 1:
                        _settle(group[0][1], exc)
                        continue
                    for events, done in group:
                        try:
                            await self._insert(events)
                        except Exception as alone:
                            _settle(done, alone)
                        else:
                            _settle(done, None)
                else:
                    for _, done in group:
                        _settle(done, None)
        finally:
            self._writing = None

    async def _insert(self, events: list[JournalEvent]) -> None:
        # The statement takes its rows as parameters (one row: one statement, atomic without
        # BEGIN; more: executed for each, in one transaction). Why not one multi-row ``VALUES``:
        # SQLAlchemy builds and compiles that statement anew for every batch size and value, which
        # cost more CPU than the database's own work.
        now = utcnow()
        await self._db.write(self._db.insert_ignoring(journal, "run_id", "seq"), [event_row(e, now) for e in events])

    async def list(
        self,
        run_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        kinds: list[str] | None = None,
    ) -> list[JournalEvent]:
        query = select(journal).where(journal.c.run_id == run_id, journal.c.seq > after_seq)
        if kinds is not None:
            query = query.where(journal.c.kind.in_(kinds))
        query = query.order_by(journal.c.seq).limit(limit)
        return [_to_event(row) for row in await self._db.rows(query)]

    async def delete_run(self, run_id: str) -> None:
        await self._db.write(delete(journal).where(journal.c.run_id == run_id))


def _settle(done: asyncio.Future[None], error: Exception | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


def _retrieve(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()
