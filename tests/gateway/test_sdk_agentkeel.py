"""What AgentKeel serves beyond the LangGraph API, and the kinds of graph it serves.

One test drives the four kinds of graph a deployment runs (plain LangGraph with custom stream
writes, a LangChain chat model, ``interrupt()``, AgentKeel's own ``lead`` agent on the scripted
model); the others cover the journal, file changes, run extras, health, readiness and metrics.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from server_support import LEAD_NOTE, KeelServer, collect, events

LEAD_INPUT = {"messages": [{"role": "user", "content": "write a note"}]}


@pytest.fixture
async def http(keel_server: KeelServer) -> Any:
    async with httpx.AsyncClient(base_url=keel_server.url, timeout=20) as c:
        yield c


async def _lead_run(client: Any) -> tuple[str, str, list[Any]]:
    tid = (await client.threads.create())["thread_id"]
    parts = await collect(client.runs.stream(tid, "lead", input=LEAD_INPUT, stream_mode=["updates", "messages-tuple"]))
    return tid, parts[0].data["run_id"], parts


async def test_serves_every_kind_of_graph(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    plain = await collect(client.runs.stream(tid, "echo", input={"steps": 1, "custom": 2}, stream_mode="custom"))
    assert [p.data for p in plain[1:]] == [{"step": 0, "j": 0}, {"step": 0, "j": 1}]

    tid = (await client.threads.create())["thread_id"]
    chat = await collect(client.runs.stream(tid, "chat", input=LEAD_INPUT, stream_mode="messages-tuple"))
    assert len(chat) > 5 and set(events(chat[1:])) == {"messages"}

    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "hitl", input={})
    assert (await client.threads.get(tid))["status"] == "interrupted"

    tid, run_id, lead = await _lead_run(client)
    tokens = [p.data[0] for p in lead if p.event == "messages"]
    assert any(t.get("tool_call_chunks") for t in tokens)  # tool-call arguments stream too
    final = [p.data for p in lead if p.event == "updates"][-1]
    assert final["model"]["messages"][-1]["content"] == f"Done: the note is at {LEAD_NOTE}."
    assert (await client.runs.get(tid, run_id))["status"] == "success"


async def test_run_extras(client: Any) -> None:
    tid, run_id, _ = await _lead_run(client)
    run = await client.runs.get(tid, run_id)
    assert run["attempt"] == 1
    assert run["stop_reasons"] == [] and run["stop_reason"] is None
    assert run["usage"]["input_tokens"] == 300 and run["usage"]["output_tokens"] == 42  # the script's figures
    assert run["usage"]["total_tokens"] == 342

    tid = (await client.threads.create())["thread_id"]
    slow = await client.runs.create(tid, "echo", input={"steps": 50, "delay": 0.05})
    await client.runs.cancel(tid, slow["run_id"], wait=True)
    cancelled = await client.runs.get(tid, slow["run_id"])
    assert cancelled["stop_reason"] == "cancelled"
    (reason,) = cancelled["stop_reasons"]
    assert {"code", "source", "seq", "detail", "class"} <= set(reason) and reason["class"] == "cancellation"


async def test_journal_and_changes(client: Any, http: httpx.AsyncClient) -> None:
    tid, run_id, _ = await _lead_run(client)
    base = f"/threads/{tid}/runs/{run_id}"
    journal = (await http.get(f"{base}/journal")).json()
    kinds = [e["kind"] for e in journal]
    assert kinds[0] == "run.start" and kinds[-1] == "run.end"
    assert {"model.call", "tool.call", "file.changed"} <= set(kinds)
    assert [e["seq"] for e in journal] == sorted(e["seq"] for e in journal)
    assert all(e["run_id"] == run_id for e in journal)

    calls = (await http.get(f"{base}/journal", params=[("kind", "model.call"), ("kind", "tool.call")])).json()
    assert [e["kind"] for e in calls] == [k for k in kinds if k in ("model.call", "tool.call")]
    later = (await http.get(f"{base}/journal", params={"after_seq": journal[1]["seq"], "limit": 2})).json()
    assert [e["seq"] for e in later] == [e["seq"] for e in journal[2:4]]

    (change,) = (await http.get(f"{base}/changes")).json()
    assert change["path"] == LEAD_NOTE and change["change"] == "added" and change["tool_name"] == "write_file"
    assert change["seq"] in [e["seq"] for e in journal if e["kind"] == "file.changed"]

    other = (await client.threads.create())["thread_id"]
    assert (await http.get(f"/threads/{other}/runs/{run_id}/journal")).status_code == 404
    assert (await http.get(f"/threads/{other}/runs/{run_id}/changes")).status_code == 404


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


async def test_health_readiness_metrics(client: Any, http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"ok": True}
    assert (await http.get("/ok")).json()["ok"] is True
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ok": True, "store": "ok", "stream": "ok", "draining": False}
    assert (await http.get("/info")).json()["flags"]["assistants"] is True

    before = (await http.get("/metrics")).text
    tid = (await client.threads.create())["thread_id"]
    await collect(client.runs.stream(tid, "echo", input={"steps": 2}, stream_mode="updates"))
    after = await http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    assert _metric(text, "agentkeel_runs_created_total") == _metric(before, "agentkeel_runs_created_total") + 1
    success = 'agentkeel_runs_finished_total{status="success",stop_reason="none"}'
    assert _metric(text, success) >= _metric(before, success) + 1
    assert _metric(text, "agentkeel_stream_events_sent_total") >= _metric(before, "agentkeel_stream_events_sent_total") + 3
    assert _metric(text, "agentkeel_draining") == 0
    for name in ("agentkeel_runs_active", "agentkeel_streams_open"):
        assert f"# TYPE {name} gauge" in text
