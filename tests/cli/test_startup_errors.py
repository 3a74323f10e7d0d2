"""A runtime that cannot open names the setting and the cause, and every command exits 2.

Real processes on real deployments gone wrong: a PostgreSQL server that answers but has no such
database, a SQLite file whose directory is a file, a directory or a text file given as the SQLite
file, a data directory that cannot be created.
"""

from __future__ import annotations

import socket
from pathlib import Path

from test_cli import keel_side_by_side  # type: ignore[import-not-found]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_postgresql_database_that_does_not_exist_is_named_with_the_servers_refusal(
    tmp_path: Path, pg_url: str
) -> None:
    server = pg_url.rsplit("/", 1)[0].replace("://postgres@", "://postgres:hunter2@")
    missing = f"{server}/agentkeel_no_such_database"
    (tmp_path / "keel.yaml").write_text(f"database: {missing}\ndatabase_pool: {{acquire_timeout_s: 1}}\n")
    serve, worker, run = keel_side_by_side(
        ("serve", "--port", str(_free_port()), "--config", "keel.yaml"),
        ("worker", "--config", "keel.yaml"),
        ("run", "hi", "--config", "keel.yaml"),
        cwd=tmp_path,
    )
    for done in (serve, worker, run):
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert "Traceback" not in out and "PoolTimeout" not in out, out
        assert "cannot start: database: no connection to " in out, out
        assert "within 1 s (database_pool.acquire_timeout_s)" in out, out
        assert 'database "agentkeel_no_such_database" does not exist' in out, out
        assert "hunter2" not in out and ":***@" in out, out  # the URL is shown, its password is not
    assert "listening" not in serve.stdout and "ready" not in worker.stdout


def test_a_sqlite_file_or_data_dir_that_cannot_be_created_or_read_is_named_with_the_cause(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "sqlite.yaml").write_text(f"database: sqlite:///{tmp_path}/a-file/keel.db\n")
    (tmp_path / "data.yaml").write_text(f"data_dir: {tmp_path}/a-file/data\n")
    (tmp_path / "dir.yaml").write_text(f"database: sqlite:///{tmp_path}\n")
    (tmp_path / "notes.txt").write_text("these are notes, not a database\n" * 20)
    (tmp_path / "notes.yaml").write_text(f"database: sqlite:///{tmp_path}/notes.txt\n")
    sqlite_serve, data_dir, directory, not_a_database = keel_side_by_side(
        ("serve", "--port", str(_free_port()), "--config", "sqlite.yaml"),
        ("run", "hi", "--config", "data.yaml"),
        ("runs", "list", "--config", "dir.yaml"),
        ("run", "hi", "--config", "notes.yaml"),
        cwd=tmp_path,
    )
    expected = {
        sqlite_serve: f"cannot start: database: cannot open sqlite:///{tmp_path}/a-file/keel.db: ",
        data_dir: f"cannot start: data_dir: cannot create {tmp_path}/a-file/data: ",
        directory: f"cannot start: database: cannot open sqlite:///{tmp_path}: unable to open database file",
        not_a_database: f"cannot start: database: cannot open sqlite:///{tmp_path}/notes.txt: file is not a database",
    }
    for done, line in expected.items():
        out = done.stdout + done.stderr
        assert done.returncode == 2 and line in out and "Traceback" not in out, out
    # nothing was written over what was there
    assert (tmp_path / "a-file").read_text() == "not a directory\n"
    assert (tmp_path / "notes.txt").read_text() == "these are notes, not a database\n" * 20
