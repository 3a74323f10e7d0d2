"""Threads, runs and the run journal.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written out in full rather than derived from ``sql_schema`` so that this revision keeps describing
the schema as it was when later revisions change the tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)
_RUNNING = sa.text("status = 'running'")


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("thread_id", sa.String(), primary_key=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("metadata", _JSON, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(), primary_key=True),
        sa.Column(
            "thread_id",
            sa.String(),
            sa.ForeignKey("threads.thread_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("assistant_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String()),
        sa.Column("lease_expires_at", _TS),
        sa.Column("multitask_strategy", sa.String(), nullable=False),
        sa.Column("on_disconnect", sa.String(), nullable=False),
        sa.Column("kwargs", _JSON, nullable=False),
        sa.Column("metadata", _JSON, nullable=False),
        sa.Column("stop_reasons", _JSON, nullable=False),
        sa.Column("usage", _JSON, nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("started_at", _TS),
        sa.Column("ended_at", _TS),
        sa.Column("queue_seq", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'success', 'error', 'timeout', 'interrupted')",
            name="ck_runs_status",
        ),
    )
    op.create_index("ix_runs_thread_status", "runs", ["thread_id", "status"])
    op.create_index("uq_runs_thread_queue_seq", "runs", ["thread_id", "queue_seq"], unique=True)
    op.create_index(
        "uq_runs_thread_running",
        "runs",
        ["thread_id"],
        unique=True,
        sqlite_where=_RUNNING,
        postgresql_where=_RUNNING,
    )
    op.create_table(
        "journal",
        sa.Column("run_id", sa.String(), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("thread_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("caller", sa.String()),
        sa.Column("data", _JSON, nullable=False),
        sa.Column("ts", _TS, nullable=False),
    )
    op.create_index("ix_journal_thread", "journal", ["thread_id"])


def downgrade() -> None:
    op.drop_table("journal")
    op.drop_table("runs")
    op.drop_table("threads")
