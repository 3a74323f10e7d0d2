"""Alembic environment: migrate on the connection ``SqlDatabase.setup`` hands over.

There is no ``alembic.ini`` and no URL here: the caller already holds an open transaction (and, on
PostgreSQL, the migration lock), and alembic runs inside it.
"""

from __future__ import annotations

from alembic import context

context.configure(connection=context.config.attributes["connection"])
with context.begin_transaction():
    context.run_migrations()
