"""Alembic migrations of the SQL stores, shipped in the package and run by ``SqlDatabase.setup``.

A package (not a bare folder) so that a regular install carries ``env.py`` and the revisions.
"""
