"""Assistants and their versions.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02

Written out in full rather than derived from ``sql_schema`` (see 0001).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "assistants",
        sa.Column("assistant_id", sa.String(), primary_key=True),
        sa.Column("graph_id", sa.String(), nullable=False),
        sa.Column("config", _JSON, nullable=False),
        sa.Column("context", _JSON, nullable=False),
        sa.Column("metadata", _JSON, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("description", sa.Text()),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_index("ix_assistants_graph_id", "assistants", ["graph_id"])
    op.create_table(
        "assistant_versions",
        sa.Column(
            "assistant_id",
            sa.String(),
            sa.ForeignKey("assistants.assistant_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("graph_id", sa.String(), nullable=False),
        sa.Column("config", _JSON, nullable=False),
        sa.Column("context", _JSON, nullable=False),
        sa.Column("metadata", _JSON, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("description", sa.Text()),
        sa.Column("created_at", _TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("assistant_versions")
    op.drop_table("assistants")
