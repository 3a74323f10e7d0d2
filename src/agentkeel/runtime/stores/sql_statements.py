"""The run store's statements on the path of every run (admission, start, reads by id), built once.

Why: building a statement -- coercing each value into a bound parameter, aliasing its subqueries
-- and deriving its cache key cost SQLAlchemy more CPU than SQLite took to execute it; for the
claim alone, a tenth of a run's start-up. These take their values as execution parameters
instead. An ``UPDATE`` sets the columns its parameters name; the parameters of its ``WHERE`` must
be named apart from those columns, hence the ``b_`` prefix.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, Update, bindparam, exists, func, insert, or_, select, update
from sqlalchemy.orm import aliased

from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.stores.common import ACTIVE_VALUES
from agentkeel.runtime.stores.sql_schema import runs, threads

RUN_COLUMNS = [c for c in runs.c if c.name != "queue_seq"]


def _claim_candidate(among: bool) -> Select[Any]:
    head = aliased(runs)
    other = aliased(runs)
    query = (
        select(runs.c.run_id)
        .where(
            runs.c.status == RunStatus.pending.value,
            or_(runs.c.not_before.is_(None), runs.c.not_before <= bindparam("now")),
            # the head of its thread's queue ...
            runs.c.queue_seq == select(func.min(head.c.queue_seq)).where(
                head.c.thread_id == runs.c.thread_id, head.c.status.in_(ACTIVE_VALUES)
            ).scalar_subquery(),
            # ... on a thread with nothing running
            ~exists().where(
                other.c.thread_id == runs.c.thread_id,
                other.c.status == RunStatus.running.value,
            ),
        )
        .order_by(runs.c.created_at, runs.c.queue_seq, runs.c.run_id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return query.where(runs.c.run_id.in_(bindparam("run_ids", expanding=True))) if among else query


CLAIM_ANY = _claim_candidate(among=False)
CLAIM_AMONG = _claim_candidate(among=True)  # limited to the ``run_ids`` parameter
CLAIM = (
    update(runs)
    .where(runs.c.run_id == bindparam("b_run_id"), runs.c.status == RunStatus.pending.value)
    .returning(*RUN_COLUMNS)
)
THREAD = select(threads).where(threads.c.thread_id == bindparam("thread_id"))
RUN = select(*RUN_COLUMNS).where(runs.c.run_id == bindparam("run_id"))
ACTIVE = (
    select(*RUN_COLUMNS)
    .where(runs.c.thread_id == bindparam("thread_id"), runs.c.status.in_(ACTIVE_VALUES))
    .order_by(runs.c.queue_seq)
)
# A new run is the last of its thread's queue: its ``queue_seq`` is taken in the INSERT itself
# (``b_thread_id``, the run's thread), under the admission's lock on the thread.
INSERT_RUN = insert(runs).values(
    queue_seq=select(func.coalesce(func.max(runs.c.queue_seq), 0) + 1)
    .where(runs.c.thread_id == bindparam("b_thread_id"))
    .scalar_subquery()
).returning(*RUN_COLUMNS)
UPDATE_THREAD = update(threads).where(threads.c.thread_id == bindparam("b_thread_id"))
UPDATE_THREAD_RETURNING = UPDATE_THREAD.returning(threads)
UPDATE_THREAD_UNLESS_RUNNING = UPDATE_THREAD.where(~exists().where(
    runs.c.thread_id == bindparam("b_thread_id"), runs.c.status == RunStatus.running.value
))


@functools.cache
def finish(statuses: tuple[str, ...], unless_control: bool) -> Update:
    """Ending this attempt of a run (``b_run_id``, ``b_attempt``) while it is in one of
    ``statuses`` -- and, ``unless_control``, has no stored control request."""
    statement = update(runs).where(
        runs.c.run_id == bindparam("b_run_id"), runs.c.attempt == bindparam("b_attempt"), runs.c.status.in_(statuses)
    )
    if unless_control:
        statement = statement.where(runs.c.control.is_(None))
    return statement.returning(*RUN_COLUMNS)


__all__ = [
    "ACTIVE", "CLAIM", "CLAIM_AMONG", "CLAIM_ANY", "INSERT_RUN", "RUN", "RUN_COLUMNS",
    "THREAD", "UPDATE_THREAD", "UPDATE_THREAD_RETURNING", "UPDATE_THREAD_UNLESS_RUNNING", "finish",
]
