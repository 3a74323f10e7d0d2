"""Storage backends behind one interface each: memory, SQLite, PostgreSQL."""
