"""Run ownership across processes: delayed starts, stored control requests, stream id hints.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Written out in full rather than derived from ``sql_schema`` (see 0001).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Plain ADD COLUMN (nullable or with a default) works on both dialects without a table copy.
    op.add_column("runs", sa.Column("not_before", _TS))
    op.add_column("runs", sa.Column("control", _JSON))
    op.add_column("runs", sa.Column("stream_seq", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_runs_status_lease", "runs", ["status", "lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_status_lease", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("stream_seq")
        batch.drop_column("control")
        batch.drop_column("not_before")
