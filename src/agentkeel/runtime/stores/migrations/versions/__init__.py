"""Schema revisions, oldest first; alembic skips this file."""
