"""The run resource's ``subagents``: a single-run GET lists the run's children from its journal;
lists leave them out (one store query however many runs they hold)."""

from __future__ import annotations

import httpx
from test_gateway_runs_support import client, fresh_mode, new_thread, run_status, runtime  # noqa: F401

from agentkeel.runtime.ledger import build_ledger
from agentkeel.runtime.runtime import Runtime
from children_support import EXPECTED, START_ORDER, events


async def _finished_run(client: httpx.AsyncClient, runtime: Runtime, tid: str) -> str:
    run = (await client.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {"steps": 1}})).json()
    await run_status(runtime, run["run_id"], "success")
    return str(run["run_id"])


async def test_get_run_lists_its_children(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run_id = await _finished_run(client, runtime, tid)
    last = (await runtime.journal.list(run_id))[-1].seq
    await runtime.journal.append(events(run_id, tid, first_seq=last + 1))  # as the executor journals them

    got = (await client.get(f"/threads/{tid}/runs/{run_id}")).json()
    children = got["subagents"]
    assert [c["task_id"] for c in children] == START_ORDER
    for child in children:
        assert {k: child[k] for k in EXPECTED[child["task_id"]]} == EXPECTED[child["task_id"]]
        assert child["seq"] > last
    capped = children[1]
    assert capped["usage"]["input_tokens"] == 1200 and capped["files_changed"] == ["/workspace/src/parser.py"]
    assert [r["code"] for r in capped["stop_reasons"]] == ["loop_capped"]

    record = await runtime.store.get(run_id)
    assert record is not None
    assert children == (await build_ledger(record, runtime.journal))["subagents"]  # `keel runs show` agrees
    assert (await client.get(f"/runs/{run_id}")).json()["subagents"] == children  # the stateless GET too

    listed = (await client.get(f"/threads/{tid}/runs")).json()
    assert [r["run_id"] for r in listed] == [run_id] and "subagents" not in listed[0]


async def test_a_run_without_children_has_an_empty_list(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run_id = await _finished_run(client, runtime, tid)
    assert (await client.get(f"/threads/{tid}/runs/{run_id}")).json()["subagents"] == []
    assert (await client.get(f"/threads/other/runs/{run_id}")).status_code == 404  # still checked first
