"""The run coordinate on journal events: ``journal.attempt`` and ``journal.step``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

With ``run_id`` and ``seq`` they make the coordinate ``(run_id, attempt, step, journal_seq)`` that
checkpoint metadata and stream events carry too (``runtime/timeline.py`` aligns the three by it).
Written out in full rather than derived from ``sql_schema`` (see 0001).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable ADD COLUMNs: no table copy on either dialect; older events read as None.
    op.add_column("journal", sa.Column("attempt", sa.Integer()))
    op.add_column("journal", sa.Column("step", sa.Integer()))


def downgrade() -> None:
    with op.batch_alter_table("journal") as batch:
        batch.drop_column("step")
        batch.drop_column("attempt")
