"""`keel runs show` of a run with children, as a user meets it: a real run in a real SQLite file,
its subagent records written into that journal, then the command's table and its ``--json``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from test_cli import keel

from agentkeel.database import Database
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.stores.factory import open_stores
from children_support import START_ORDER, events


async def _add_children(db: Path, run_id: str, thread_id: str) -> None:
    async with open_connections(Database.parse(f"sqlite:///{db}")) as connections:
        journal = (await open_stores(connections)).journal
        last = (await journal.list(run_id))[-1].seq
        await journal.append(events(run_id, thread_id, first_seq=last + 1))


def test_runs_show_prints_each_child_and_its_json_lists_them(tmp_path: Path) -> None:
    (tmp_path / "say.yaml").write_text("agents:\n  lead:\n    - say: Delegated and done.\n")
    (tmp_path / "keel.yaml").write_text("models: [{name: fast, use: scripted, script: say.yaml}]\n")
    ran = keel("run", "delegate it", "--config", "keel.yaml", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    ledger = json.loads(ran.stdout)
    assert ledger["subagents"] == []
    asyncio.run(_add_children(tmp_path / ".agentkeel" / "keel.db", ledger["run_id"], ledger["thread_id"]))

    shown = keel("runs", "show", ledger["run_id"], "--config", "keel.yaml", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    section = shown.stdout[shown.stdout.index("Subagents"):shown.stdout.index("Which step changed which file?")]
    assert "(4 started)" in section and "loop_capped" in section and "1,200 / 300" in section
    assert "unfinished" in section  # the run ended before t-open reported an end

    as_json = keel("runs", "show", ledger["run_id"], "--config", "keel.yaml", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    children = json.loads(as_json.stdout)["subagents"]
    assert [c["task_id"] for c in children] == START_ORDER
    assert [c["status"] for c in children] == ["completed", "completed", "cancelled", "unfinished"]
