"""WAL checkpoints run on their thread while a connection writes, and not at all while it is idle."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from agentkeel.runtime.sqlite_inline import inline_pragmas
from agentkeel.runtime.wal_checkpointer import BACKSTOP_PAGES, WalCheckpointer


def _writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in inline_pragmas():
        conn.execute(pragma)
    conn.execute("CREATE TABLE IF NOT EXISTS t (v BLOB)")
    return conn


def _wait_for(condition, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_the_log_is_copied_back_by_the_thread_and_an_idle_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "keel.db"
    checkpointer = WalCheckpointer(path, interval_s=0.01)
    checkpointer.start()  # before the file exists: it waits for it
    try:
        conn = _writer(path)
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == BACKSTOP_PAGES
        for _ in range(200):  # ~800 pages: under the backstop, so only the thread copies them back
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 16_000,))
        # The database file itself grows only when the log is copied back into it.
        assert _wait_for(lambda: path.stat().st_size > 3_000_000)
        assert _wait_for(lambda: checkpointer.checkpoints > 0)
        time.sleep(0.1)  # a round that looked at the log while it was being written takes another
        idle = checkpointer.checkpoints
        time.sleep(0.2)  # twenty looks at an unchanged log
        assert checkpointer.checkpoints == idle
        conn.execute("INSERT INTO t VALUES (?)", (b"y",))
        assert _wait_for(lambda: checkpointer.checkpoints > idle)
        conn.close()
    finally:
        checkpointer.stop()
    assert not checkpointer._thread.is_alive()
