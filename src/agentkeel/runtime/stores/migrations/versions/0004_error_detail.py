"""Why a failed run failed, as data: ``runs.error_detail``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Written out in full rather than derived from ``sql_schema`` (see 0001).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    # A nullable ADD COLUMN: no table copy on either dialect; older runs read as None.
    op.add_column("runs", sa.Column("error_detail", _JSON))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("error_detail")
