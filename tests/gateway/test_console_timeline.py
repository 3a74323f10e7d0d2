"""The run page's document (``GET /console/api/.../timeline``) through the gateway in-process, built
from the aligned timeline (``runtime/timeline.py``): a run with a subagent shows it nested under
the lead's task call with its own calls under it, file changes under the tool calls that made
them, the run's checkpoints and attempts on the same axis; a journal corrupted after the run
shows the divergence flags, in the list and on the rows they name (a stream event after END on
its stream row); a reload reads only the checkpoints it has not read yet."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from console_support import APPENDIX, REPORT, write_console_project
from server_support import LEAD_NOTE

from agentkeel.config import load_config
from agentkeel.gateway.app import create_app
from agentkeel.gateway.console.waterfall import waterfall
from agentkeel.runtime.divergence import check
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.timeline import Item, align, checkpoint_items, load_timeline


@contextlib.asynccontextmanager
async def console_gateway(root: Path) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    """The console project's gateway (auth off) in-process over a fresh SQLite runtime."""
    async with open_runtime(load_config(write_console_project(root), env={})) as runtime:
        transport = httpx.ASGITransport(app=create_app(runtime), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as http:
            yield runtime, http


async def finished_run(http: httpx.AsyncClient, **body: Any) -> tuple[str, str]:
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    waited = await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "lead", **body})
    assert waited.status_code == 200, waited.text
    return thread, (await http.get(f"/threads/{thread}/runs")).json()[0]["run_id"]


async def page_doc(http: httpx.AsyncClient, thread: str, run: str) -> dict[str, Any]:
    answer = await http.get(f"/console/api/threads/{thread}/runs/{run}/timeline")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def depth(rows: dict[str, dict[str, Any]], row: dict[str, Any]) -> int:
    return 0 if row["parent"] is None else 1 + depth(rows, rows[row["parent"]])


async def test_a_subagent_is_nested_under_its_task_call_with_its_own_calls(tmp_path: Path) -> None:
    async with console_gateway(tmp_path) as (_runtime, http):
        thread, run = await finished_run(http, input="write the report", context={"model_name": "console"})
        doc = await page_doc(http, thread, run)
    rows = {row["id"]: row for row in doc["steps"]}
    assert len(rows) == len(doc["steps"])  # ids are unique: the page nests by them
    child = next(row for row in rows.values() if row["kind"] == "subagent")
    task = rows[child["parent"]]
    assert task["kind"] == "tool" and task["detail"]["name"] == "task" and task["call_id"] == child["task_id"]
    assert task["caller"] == "lead" and task["parent"] is None and depth(rows, child) == 1
    assert child["status"] == "completed" and child["start_ms"] <= child["end_ms"] <= task["end_ms"]
    inside = [row for row in rows.values() if row["parent"] == child["id"]]
    assert {row["kind"] for row in inside} >= {"model", "tool"}
    assert all(row["caller"] == "subagent:general-purpose" for row in inside if row["kind"] in ("model", "tool"))
    # The child's file change sits under the child's write_file call, the lead's under the lead's.
    files = {row["label"]: rows[row["parent"]] for row in rows.values() if row["kind"] == "file"}
    assert files[f"added {APPENDIX}"]["parent"] == child["id"]
    assert files[f"added {REPORT}"]["caller"] == "lead" and files[f"modified {REPORT}"]["detail"]["name"] == "str_replace"
    # One axis: the run's checkpoints and its stream on it, the attempt, no divergence.
    checkpoints = [row for row in rows.values() if row["kind"] == "checkpoint"]
    assert len(checkpoints) == doc["checkpoints"] > 0 and all(row["source"] == "checkpoint" for row in checkpoints)
    assert doc["stream"]["state"] == "retained" and any(row["kind"] == "stream" for row in rows.values())
    assert [(a["attempt"], a["began"], a["ended"]) for a in doc["attempts"]] == [(1, "started", "success")]
    assert next(row for row in rows.values() if row["kind"] == "attempt")["attempt"] == 1
    assert doc["divergences"] == [] and not any(row["divergences"] for row in rows.values())
    assert [row["kind"] for row in rows.values() if row["kind"] == "stop_reason"] == ["stop_reason"]
    assert sum(1 for call in doc["model_calls"] if call["caller"] == "subagent:general-purpose") == 2
    assert doc["run"]["subagents"][0]["task_id"] == child["task_id"] == doc["subagents"][0]["task_id"]


async def test_a_corrupted_journal_shows_its_divergence_flags(tmp_path: Path) -> None:
    async with console_gateway(tmp_path) as (runtime, http):
        thread, run = await finished_run(http, input={"messages": [{"role": "user", "content": "write a note"}]})
        clean = await page_doc(http, thread, run)
        assert clean["divergences"] == [] and clean["changes"][0]["path"] == LEAD_NOTE
        last = clean["last_seq"]
        await runtime.journal.append([  # a seq skipped, then a stop reason after the terminal run.end
            JournalEvent(run, thread, last + 2, "stop_reason", {"code": "token_capped", "source": "middleware:TokenBudget"},
                         "middleware:TokenBudget", attempt=1),
        ])
        doc = await page_doc(http, thread, run)
    flags = {flag["code"]: flag for flag in doc["divergences"]}
    assert set(flags) == {"journal_gap", "stop_after_terminal"}, doc["divergences"]
    assert flags["journal_gap"]["journal_seq"] == last + 1 and str(last + 1) in flags["journal_gap"]["detail"]
    forged = next(row for row in doc["steps"] if row["seq"] == last + 2)
    assert forged["kind"] == "stop_reason" and forged["divergences"] == ["stop_after_terminal"]
    assert [row["seq"] for row in doc["steps"] if row["divergences"]] == [last + 2]


async def test_a_reload_reads_only_checkpoints_newer_than_those_it_knows(tmp_path: Path) -> None:
    async with console_gateway(tmp_path) as (runtime, http):
        thread, run = await finished_run(http, input={"messages": [{"role": "user", "content": "write a note"}]})
        record = await runtime.store.get(run)
        assert record is not None
        full = await checkpoint_items(runtime.checkpointer, record)
        ids = [item.ident for item in full]
        assert len(ids) >= 3
        # The known items are kept as they are (not read again); the newer ones are read.
        older = [replace(item, data={**item.data, "source": "known"}) for item in full[:2]]
        again = await checkpoint_items(runtime.checkpointer, record, older)
        assert [item.ident for item in again] == ids and [item.data["source"] for item in again[:2]] == ["known"] * 2
        assert again[2:] == full[2:]
        # Known items whose newest checkpoint is no longer stored are dropped: all is read again.
        gone = [replace(full[0], ident="0" * 8 + "-gone")]
        assert await checkpoint_items(runtime.checkpointer, record, gone) == full
        # The page's document is the same on a reload (which reuses the items it read).
        first, second = await page_doc(http, thread, run), await page_doc(http, thread, run)
        assert first["steps"] == second["steps"] and first["checkpoints"] == len(ids)


async def test_a_stream_event_after_end_is_marked_on_its_stream_row(tmp_path: Path) -> None:
    async with console_gateway(tmp_path) as (runtime, http):
        _thread, run = await finished_run(http, input={"messages": [{"role": "user", "content": "write a note"}]})
        timeline = await load_timeline(runtime, run)
    assert timeline is not None and timeline.record.started_at is not None
    end = next(e for e in timeline.events if e.kind == "run.end")
    timeline.stream.append(Item("stream", "values", 1, None, end.seq, data={"stamped": True}, ident=99))
    timeline.items = align(timeline.events, timeline.checkpoints, timeline.stream)
    timeline.divergences = check(timeline)
    rows = waterfall(timeline, timeline.record.started_at)
    assert [(row["kind"], row["label"], row["divergences"]) for row in rows if row["divergences"]] == [
        ("stream", "stream #99: values", ["stream_after_end"])]  # not the run.end record at the same seq
