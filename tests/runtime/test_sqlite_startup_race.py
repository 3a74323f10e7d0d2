"""Processes starting together on one fresh SQLite file all migrate it, and all start.

Seen as a flaky ``keel run`` test (two runs side by side on one database): one process died at
start-up with ``sqlite3.OperationalError: duplicate column name: expires_at``, the key-value
store's migration run twice. Each opener here is a real process, as each ``keel run`` is. A round
rarely loses the race, so the processes run many rounds, each on a new file: per round every
process announces it is ready and waits for the round's start file, so all reach the migrations
together. Imports are paid once per process, which keeps a round to a fraction of a second.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from langgraph.store.sqlite.base import MIGRATIONS as STORE_MIGRATIONS

from agentkeel.runtime.stores.sql_engine import MIGRATIONS_DIR

PROCESSES = 4
ROUNDS = 25
TIMEOUT_S = 120.0

# Everything a runtime opens on its database at start-up, in the runtime's order; per round.
OPENER = """
import asyncio, sys, time, traceback
from pathlib import Path
from agentkeel.database import Database
from agentkeel.runtime.checkpoints.savers import open_checkpointer
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.kvstore import open_kv_store
from agentkeel.runtime.stores.factory import open_stores

folder, me, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

async def start_up(db: Path) -> None:
    async with open_connections(Database.parse(f"sqlite:///{db}")) as connections:
        await open_stores(connections)
        async with open_checkpointer(connections), open_kv_store(connections):
            pass

failed = 0
for round_ in range(rounds):
    (folder / f"ready-{round_}-{me}").touch()
    while not (folder / f"start-{round_}").exists():
        time.sleep(0.001)
    try:
        asyncio.run(start_up(folder / f"{round_}.db"))
    except Exception:
        failed += 1
        print(f"round {round_}:", traceback.format_exc(), file=sys.stderr)
sys.exit(1 if failed else 0)
"""


def _race(folder: Path) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(folder), str(me), str(ROUNDS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for me in range(PROCESSES)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    for round_ in range(ROUNDS):
        readies = [folder / f"ready-{round_}-{me}" for me in range(PROCESSES)]
        while not all(r.exists() for r in readies) and time.monotonic() < deadline:
            time.sleep(0.001)
        (folder / f"start-{round_}").touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT_S)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def _head() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def test_processes_racing_on_a_fresh_sqlite_file_all_start_and_leave_it_at_head(
    tmp_path: Path,
) -> None:
    results = _race(tmp_path)
    failed = [r.stderr[-3000:] for r in results if r.returncode != 0]
    assert failed == [], f"{len(failed)} of {PROCESSES} processes failed a round:\n" + "\n".join(failed)
    head = _head()
    for round_ in range(ROUNDS):
        with sqlite3.connect(tmp_path / f"{round_}.db") as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
            versions = [v for (v,) in conn.execute("SELECT v FROM store_migrations ORDER BY v")]
            assert versions == list(range(len(STORE_MIGRATIONS)))
            store_columns = {row[1] for row in conn.execute("PRAGMA table_info(store)")}
            assert {"expires_at", "ttl_minutes"} <= store_columns
            write_columns = {row[1] for row in conn.execute("PRAGMA table_info(writes)")}
            assert "task_path" in write_columns
