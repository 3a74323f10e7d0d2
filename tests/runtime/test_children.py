"""A run's children (``runtime/children.py``) as the ledger and the run resource read them from the
journal: memory and SQLite journal stores, synthetic records shaped as the executor writes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentkeel.database import Database
from agentkeel.runtime.children import CHILD_KINDS, children_of, run_children
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.ledger import build_ledger
from agentkeel.runtime.records import RunRecord, RunStatus, new_run_id
from agentkeel.runtime.stores.base import JournalEvent, JournalStore
from agentkeel.runtime.stores.factory import open_stores
from children_support import EXPECTED, START_ORDER, end, events, start

ITEM_FIELDS = {"task_id", "subagent_type", "description", "status", "stop_reason", "stop_reasons", "usage", "model",
               "depth", "files_changed", "turns", "duration_s", "seq", "error", "brief"}


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JournalStore]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/db/keel.db"
    async with open_connections(Database.parse(url)) as connections:
        yield (await open_stores(connections)).journal


async def _run_with_children(journal: JournalStore, status: RunStatus) -> RunRecord:
    record = RunRecord(run_id=new_run_id(), thread_id="t-children", assistant_id="lead", status=status)
    await journal.append(events(record.run_id, record.thread_id))
    return record


async def test_the_ledger_lists_each_child_in_start_order(journal: JournalStore) -> None:
    record = await _run_with_children(journal, RunStatus.success)
    children = (await build_ledger(record, journal))["subagents"]
    assert [c["task_id"] for c in children] == START_ORDER
    seqs = [c["seq"] for c in children]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for child in children:
        assert set(child) == ITEM_FIELDS
        assert {k: child[k] for k in EXPECTED[child["task_id"]]} == EXPECTED[child["task_id"]]

    done, capped, cancelled, unfinished = children
    assert done["usage"] == {"input_tokens": 800, "output_tokens": 150, "total_tokens": 950, "calls": 3}
    assert done["stop_reasons"] == [] and done["error"] is None and done["brief"] == "Find the sources: done"
    assert done["description"] == "Find the sources" and done["model"] == "fast" and done["depth"] == 1
    assert [r["code"] for r in capped["stop_reasons"]] == ["loop_capped"]
    assert capped["files_changed"] == ["/workspace/src/parser.py"]
    assert cancelled["error"] == "cancelled by the parent run"
    # no end: what it spent, changed and why it stopped are unknown, not zero
    assert unfinished["usage"] is None and unfinished["stop_reasons"] == [] and unfinished["files_changed"] == []
    assert unfinished["description"] == "Write the tests" and unfinished["duration_s"] is None


async def test_a_child_without_an_end_is_running_while_the_run_is_active(journal: JournalStore) -> None:
    record = await _run_with_children(journal, RunStatus.running)
    statuses = {c["task_id"]: c["status"] for c in (await build_ledger(record, journal))["subagents"]}
    assert statuses == {"t-done": "completed", "t-capped": "completed", "t-cancel": "cancelled", "t-open": "running"}


async def test_the_run_resource_and_the_ledger_share_one_parser_and_one_query(
    journal: JournalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = await _run_with_children(journal, RunStatus.interrupted)
    queries: list[list[str] | None] = []
    listing = journal.list

    async def counted(run_id: str, *args: Any, **kwargs: Any) -> list[JournalEvent]:
        queries.append(kwargs.get("kinds"))
        return await listing(run_id, *args, **kwargs)

    monkeypatch.setattr(journal, "list", counted)
    children = await run_children(journal, record)
    assert queries == [list(CHILD_KINDS)]
    assert children == (await build_ledger(record, journal))["subagents"]


async def test_a_run_without_children_has_an_empty_list(journal: JournalStore) -> None:
    record = RunRecord(run_id=new_run_id(), thread_id="t-none", assistant_id="lead", status=RunStatus.success)
    await journal.append(events(record.run_id, record.thread_id, [("model.call", "lead", {"model": "fast"})]))
    assert (await build_ledger(record, journal))["subagents"] == []
    assert await run_children(journal, record) == []


def test_a_task_started_again_shows_its_last_attempt() -> None:
    """A recovered run re-running a task: the first start never ended, the second did."""
    records = [start("t1", "coder", "Fix it"), start("t1", "coder", "Fix it"), end("t1", "coder", "Fix it", "failed",
                                                                                   error="ToolError: boom")]
    (child,) = children_of(events("r", "t", records), run_ended=True)
    assert child["status"] == "failed" and child["seq"] == 2 and child["error"] == "ToolError: boom"
    again = [*records, start("t1", "coder", "Fix it")]  # started once more after it ended
    (child,) = children_of(events("r", "t", again), run_ended=False)
    assert child["status"] == "running" and child["seq"] == 4 and child["error"] is None


def test_sparse_records_are_read_without_guessing() -> None:
    """An end whose start was lost, with only a few fields: the type comes from the caller, the
    rest stays unknown; an unknown status is passed through."""
    sparse = [("subagent.end", "subagent:critic", {"task_id": "t9", "status": "exploded"})]
    (child,) = children_of(events("r", "t", sparse), run_ended=True)
    assert child["subagent_type"] == "critic" and child["status"] == "exploded" and child["seq"] == 1
    assert child["usage"] is None and child["stop_reasons"] == [] and child["files_changed"] == []
    terse_end = ("subagent.end", "subagent:critic", {"task_id": "t9", "status": "failed", "description": None})
    (child,) = children_of(events("r", "t", [start("t9", "critic", "Review it"), terse_end]), run_ended=True)
    assert child["description"] == "Review it" and child["model"] == "fast" and child["status"] == "failed"


_ops = st.lists(st.tuples(st.sampled_from(["subagent.start", "subagent.end", "model.call"]),
                          st.sampled_from(["a", "b", "c", "d"])), max_size=30)


@given(ops=_ops, run_ended=st.booleans())
def test_one_item_per_task_in_start_order(ops: list[tuple[str, str]], run_ended: bool) -> None:
    records = [(kind, "subagent:x", {"task_id": task, "status": "completed"}) for kind, task in ops]
    children = children_of(events("r", "t", records), run_ended=run_ended)
    tasks = {task for kind, task in ops if kind != "model.call"}
    assert sorted(c["task_id"] for c in children) == sorted(tasks)
    seqs = [c["seq"] for c in children]
    assert seqs == sorted(seqs)
    for child in children:
        seq_of = {kind: seq for seq, (kind, task) in enumerate(ops, start=1) if task == child["task_id"]}
        last_start, last_end = seq_of.get("subagent.start"), seq_of.get("subagent.end")
        assert child["seq"] == (last_start if last_start is not None else last_end)
        ended = last_end is not None and (last_start is None or last_end > last_start)
        assert child["status"] == ("completed" if ended else "unfinished" if run_ended else "running")
