"""The SQL tables as SQLAlchemy Core objects, for building queries.

The schema itself is created by the alembic migrations in ``migrations/versions`` (which stay frozen
as history); this module must describe the schema the newest revision produces.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.stores.common import as_utc


class UtcDateTime(TypeDecorator[datetime]):
    """A tz-aware UTC datetime on both dialects.

    SQLite's ``DATETIME`` drops the offset on write and returns naive values; converting to UTC on
    the way in and tagging UTC on the way out makes both dialects hand back equal values.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return as_utc(value)


# JSONB on PostgreSQL: binary storage and equality; plain JSON text elsewhere.
Json: Any = JSON().with_variant(JSONB(), "postgresql")
# For nullable JSON columns tested with ``IS NULL``: Python None is SQL NULL, not JSON ``null``.
NullableJson: Any = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")

RUN_STATUS_SQL = ", ".join(f"'{s.value}'" for s in RunStatus)
RUNNING_ONLY = "status = 'running'"

metadata = MetaData()

threads = Table(
    "threads",
    metadata,
    Column("thread_id", String, primary_key=True),
    Column("status", String, nullable=False),
    Column("metadata", Json, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String, primary_key=True),
    Column(
        "thread_id",
        String,
        ForeignKey("threads.thread_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("assistant_id", String, nullable=False),
    Column("status", String, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("owner", String),
    Column("lease_expires_at", UtcDateTime),
    Column("multitask_strategy", String, nullable=False),
    Column("on_disconnect", String, nullable=False),
    Column("kwargs", Json, nullable=False),
    Column("metadata", Json, nullable=False),
    Column("stop_reasons", Json, nullable=False),
    Column("usage", Json, nullable=False),
    Column("error", Text),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime),
    Column("ended_at", UtcDateTime),
    Column("queue_seq", Integer, nullable=False),
    Column("not_before", UtcDateTime),
    Column("control", NullableJson),
    Column("stream_seq", Integer, nullable=False, server_default=text("0")),
    Column("error_detail", NullableJson),
    CheckConstraint(f"status IN ({RUN_STATUS_SQL})", name="ck_runs_status"),
    Index("ix_runs_thread_status", "thread_id", "status"),
    Index("ix_runs_status_lease", "status", "lease_expires_at"),
    Index("uq_runs_thread_queue_seq", "thread_id", "queue_seq", unique=True),
    # The database itself guarantees at most one running run per thread, whatever the caller does.
    Index(
        "uq_runs_thread_running",
        "thread_id",
        unique=True,
        sqlite_where=text(RUNNING_ONLY),
        postgresql_where=text(RUNNING_ONLY),
    ),
)

journal = Table(
    "journal",
    metadata,
    Column("run_id", String, primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("thread_id", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("caller", String),
    Column("data", Json, nullable=False),
    Column("ts", UtcDateTime, nullable=False),
    Column("attempt", Integer),
    Column("step", Integer),
    Index("ix_journal_thread", "thread_id"),
)

assistants = Table(
    "assistants",
    metadata,
    Column("assistant_id", String, primary_key=True),
    Column("graph_id", String, nullable=False),
    Column("config", Json, nullable=False),
    Column("context", Json, nullable=False),
    Column("metadata", Json, nullable=False),
    Column("name", String, nullable=False),
    Column("description", Text),
    Column("version", Integer, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Index("ix_assistants_graph_id", "graph_id"),
)

# Every version ever written, the current one included; ``assistants.version`` names the current.
assistant_versions = Table(
    "assistant_versions",
    metadata,
    Column(
        "assistant_id",
        String,
        ForeignKey("assistants.assistant_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("graph_id", String, nullable=False),
    Column("config", Json, nullable=False),
    Column("context", Json, nullable=False),
    Column("metadata", Json, nullable=False),
    Column("name", String, nullable=False),
    Column("description", Text),
    Column("created_at", UtcDateTime, nullable=False),
)
