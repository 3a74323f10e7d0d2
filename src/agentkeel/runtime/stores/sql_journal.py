"""The SQL journal store (SQLite and PostgreSQL), sharing the run store's database.

The journal has no foreign key to ``runs``: a late writer's append must never fail because its run
was deleted meanwhile. ``SqlRunStore.delete_run``/``delete_thread`` remove events explicitly, in
the same transaction as the rows they belong to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import RowMapping

from agentkeel.runtime.records import utcnow
from agentkeel.runtime.stores.base import JournalEvent, JournalStore
from agentkeel.runtime.stores.sql_engine import SqlBacked
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
    async def append(self, events: list[JournalEvent]) -> None:
        """Insert the batch in one transaction; a ``(run_id, seq)`` already stored is skipped."""
        if not events:
            return
        now = utcnow()
        rows = [event_row(e, now) for e in events]
        await self._db.write(self._db.insert_ignoring(journal, "run_id", "seq"), rows)

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
