"""SQLite's WAL checkpoints on a thread of their own, off the event loop.

Why: in WAL mode every commit appends its pages to the write-ahead log, and by default the commit
that takes the log past 1,000 pages also copies the log back into the database file and syncs
both: the one place an inline commit (``sqlite_inline.py``) waits for the disk, on the event
loop's thread. A 200-step run with full checkpoints writes about 15,000 pages, so those copies
were a good part of what its commits cost the loop (``benchmarks/run_overhead.py``). Here a
daemon thread runs a ``PASSIVE`` checkpoint on a connection of its own whenever the log was
written since its last one (it looks every ``INTERVAL_S``; an idle database costs a ``stat``);
``sqlite3`` releases the GIL while SQLite works, so the copy and the syncs run beside the loop,
on another core. ``PASSIVE`` never waits for a lock: it copies what no reader still needs and
leaves the rest for the next round.

The inline connections keep SQLite's automatic checkpoint as a backstop, at ``BACKSTOP_PAGES``
(``inline_pragmas``): if this thread falls behind, or a process without one writes, the log
still cannot grow past that before a commit checkpoints it as before.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

INTERVAL_S = 0.05  # between two looks at the log: a short log is cheap to copy while it is cached
BACKSTOP_PAGES = 10_000  # the inline connections' own automatic checkpoint (about 40 MB of log)


class WalCheckpointer:
    """Checkpoints the WAL of the database at ``path`` every ``interval_s`` until ``stop``."""

    def __init__(self, path: Path, interval_s: float = INTERVAL_S) -> None:
        self._path = path
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"agentkeel-wal-{path.name}", daemon=True)
        self.checkpoints = 0
        """Checkpoints run so far (each may have had nothing to copy)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the checkpoint in progress, if any (waits for it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        wal = self._path.with_name(self._path.name + "-wal")
        seen = -1  # the log's modification time at the last checkpoint
        try:
            while not self._stop.wait(self._interval_s):
                try:
                    written = wal.stat().st_mtime_ns
                except FileNotFoundError:
                    continue
                if written == seen:
                    continue
                if conn is None:
                    if not self._path.exists():
                        continue  # nothing to checkpoint until the stores have created it
                    # Never creates the file, never waits for a lock (``busy_timeout`` 0).
                    conn = sqlite3.connect(f"file:{self._path}?mode=rw", uri=True, timeout=0,
                                           check_same_thread=False, isolation_level=None)
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                    seen = written
                except sqlite3.Error as exc:  # busy, or the file went away: try again next round
                    log.debug("WAL checkpoint of %s skipped: %r", self._path, exc)
        except Exception:  # the backstop still bounds the log; say why this thread stopped
            log.exception("the WAL checkpoint thread of %s stopped", self._path)
        finally:
            if conn is not None:
                conn.close()


__all__ = ["BACKSTOP_PAGES", "INTERVAL_S", "WalCheckpointer"]
