"""Thread runs over HTTP: create, get, list, wait, stream, join, replay, delete."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from test_gateway_runs_support import (  # noqa: F401
    WRITER_SCRIPT,
    client,
    fresh_mode,
    make_config,
    new_thread,
    parse_sse,
    run_status,
    runtime,
)

from agentkeel.gateway.app import create_app
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.stores.assistants import system_assistant_id

ECHO = {"assistant_id": "echo", "input": {"steps": 2}}


async def test_create_on_unknown_thread_is_404_unless_if_not_exists_create(client: httpx.AsyncClient, runtime: Runtime) -> None:
    missing = await client.post("/threads/nope/runs", json=ECHO)
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Thread or assistant not found."}
    assert await runtime.store.get_thread("nope") is None

    created = await client.post("/threads/nope/runs", json={**ECHO, "if_not_exists": "create"})
    assert created.status_code == 200
    run = created.json()
    assert created.headers["content-location"] == f"/threads/nope/runs/{run['run_id']}"
    assert run["thread_id"] == "nope"
    assert run["status"] == "running"  # startable, so claimed by its own admission: the stored truth
    assert run["multitask_strategy"] == "enqueue"  # the LangGraph server's default
    await run_status(runtime, run["run_id"], "success")


async def test_get_run_has_langgraph_fields_and_agentkeel_extras(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run = (await client.post(f"/threads/{tid}/runs", json={"assistant_id": "lead", "input": "hi"})).json()
    await run_status(runtime, run["run_id"], "success")
    got = (await client.get(f"/threads/{tid}/runs/{run['run_id']}")).json()
    for key in ("run_id", "thread_id", "assistant_id", "metadata", "status", "kwargs", "multitask_strategy",
                "created_at", "updated_at", "stop_reasons", "stop_reason", "usage", "attempt"):
        assert key in got, key
    assert got["status"] == "success" and got["attempt"] == 1
    assert got["usage"]["input_tokens"] == 10 and got["usage"]["output_tokens"] == 2
    assert "owner" not in got and "lease_expires_at" not in got
    assert (await client.get(f"/threads/{tid}/runs/{uuid.uuid4()}")).status_code == 404
    assert (await client.get(f"/threads/other/runs/{run['run_id']}")).status_code == 404  # wrong thread


async def test_list_runs_newest_first_with_status_filter_and_paging(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    ids = []
    for _ in range(3):
        run = (await client.post(f"/threads/{tid}/runs", json=ECHO)).json()
        ids.append(run["run_id"])
        await run_status(runtime, run["run_id"], "success")
    listed = (await client.get(f"/threads/{tid}/runs")).json()
    assert [r["run_id"] for r in listed] == ids[::-1]
    page = (await client.get(f"/threads/{tid}/runs", params={"limit": 1, "offset": 1})).json()
    assert [r["run_id"] for r in page] == [ids[1]]
    assert (await client.get(f"/threads/{tid}/runs", params={"status": "error"})).json() == []
    selected = (await client.get(f"/threads/{tid}/runs", params={"select": ["run_id", "status"]})).json()
    assert set(selected[0]) == {"run_id", "status"}
    assert (await client.get("/threads/missing/runs")).status_code == 404


async def test_wait_answers_final_values_after_the_end(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs/wait", json=ECHO)
    assert response.status_code == 200
    run_path = response.headers["content-location"]
    assert response.headers["location"] == f"{run_path}/join"
    assert response.json() == {"steps": 2, "log": ["stepped"]}
    run_id = run_path.rsplit("/", 1)[1]
    assert (await runtime.store.get(run_id)).status.value == "success"  # type: ignore[union-attr]
    # join on the finished run answers the same body at once
    joined = await client.get(f"{run_path}/join")
    assert joined.json() == {"steps": 2, "log": ["stepped"]}


async def test_wait_on_an_error_run_answers_error_not_values(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    await client.post(f"/threads/{tid}/runs/wait", json=ECHO)  # the thread now has values
    body = (await client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "broken", "input": {}})).json()
    assert body == {"__error__": {"error": "ValueError", "message": "the graph failed on purpose"}}


async def test_wait_on_an_interrupt_includes_it(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    body = (await client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "hitl", "input": {"log": []}})).json()
    assert body["__interrupt__"][0]["value"] == {"question": "approve?"}
    assert body["__interrupt__"][0]["id"]
    resumed = await client.post(
        f"/threads/{tid}/runs/wait", json={"assistant_id": "hitl", "command": {"resume": "yes"}}
    )
    assert resumed.json() == {"log": ["asked"], "answer": "yes"}


async def test_stream_has_metadata_first_and_an_id_on_every_data_event(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(
        f"/threads/{tid}/runs/stream", json={**ECHO, "stream_mode": ["values", "custom"]}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    run_path = response.headers["content-location"]
    assert response.headers["location"] == f"{run_path}/stream"
    frames = [f for f in parse_sse(response.text) if "event" in f]
    run_id = run_path.rsplit("/", 1)[1]
    assert frames[0]["event"] == "metadata" and frames[0]["data"] == {"run_id": run_id, "attempt": 1}
    assert [f["event"] for f in frames[1:]] == ["values", "custom", "custom", "values"]
    assert [f["id"] for f in frames] == [f"{n}-0" for n in range(1, 6)]
    assert frames[-1]["data"] == {"steps": 2, "log": ["stepped"]}
    assert all(f["event"] != "end" for f in frames)  # gateway.end_event is off by default


async def test_join_stream_replays_strictly_after_last_event_id(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs/stream", json={**ECHO, "stream_mode": ["custom"]})
    path = response.headers["location"]
    ids = [f["id"] for f in parse_sse(response.text) if "id" in f]
    assert ids == ["1-0", "2-0", "3-0"]

    after = parse_sse((await client.get(path, headers={"Last-Event-ID": "1-0"})).text)
    assert [f["id"] for f in after] == ["2-0", "3-0"]
    for start in ("-1", "-", "0", "0-0"):
        replay = parse_sse((await client.get(path, headers={"Last-Event-ID": start})).text)
        assert [f["id"] for f in replay] == ids, start
    # without Last-Event-ID a join gets only what comes after it: the run is over, so nothing
    assert [f for f in parse_sse((await client.get(path)).text) if "event" in f] == []
    bad = await client.get(path, headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 422 and bad.json()["field"] == "Last-Event-ID"
    assert (await client.get(f"/threads/{tid}/runs/{uuid.uuid4()}/stream")).status_code == 404


async def test_join_stream_honours_every_repeated_stream_mode(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs/stream", json=ECHO)
    path = response.headers["location"]
    # POST works like GET (the JS SDK's joinStream); unknown modes are refused before streaming
    replay = await client.post(f"{path}?stream_mode=values&stream_mode=custom", headers={"Last-Event-ID": "-1"})
    assert replay.status_code == 200
    bad = await client.get(path, params={"stream_mode": ["values", "tools"]})
    assert bad.status_code == 422 and bad.json()["field"] == "stream_mode"


async def test_enqueue_is_the_default_and_reject_conflicts_with_409(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    slow = {"assistant_id": "echo", "input": {"steps": 1, "delay": 0.5}}
    first = (await client.post(f"/threads/{tid}/runs", json=slow)).json()
    await run_status(runtime, first["run_id"], "running")
    second = (await client.post(f"/threads/{tid}/runs", json=ECHO)).json()
    assert second["status"] == "pending"
    rejected = await client.post(f"/threads/{tid}/runs", json={**ECHO, "multitask_strategy": "reject"})
    assert rejected.status_code == 409
    assert rejected.json()["detail"].startswith("Thread is already running a task.")
    await run_status(runtime, second["run_id"], "success")


async def test_delete_run_refuses_an_active_run(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run = (await client.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {"delay": 0.4}})).json()
    path = f"/threads/{tid}/runs/{run['run_id']}"
    assert (await client.delete(path)).status_code == 409
    await run_status(runtime, run["run_id"], "success")
    assert (await client.delete(path)).status_code == 204
    assert (await client.get(path)).status_code == 404
    assert (await client.delete(path)).status_code == 404


async def test_system_assistant_uuid_and_graph_name_both_resolve(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    body = (await client.post(
        f"/threads/{tid}/runs/wait", json={"assistant_id": system_assistant_id("echo"), "input": {"steps": 1}}
    )).json()
    assert body == {"steps": 1, "log": ["stepped"]}
    unknown = await client.post(f"/threads/{tid}/runs", json={"assistant_id": str(uuid.uuid4())})
    assert unknown.status_code == 404 and unknown.json()["field"] == "assistant_id"


async def test_journal_and_changes(tmp_path: Path, fresh_mode: None) -> None:
    async with open_runtime(make_config(tmp_path, script=WRITER_SCRIPT)) as rt:
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            tid = await new_thread(rt)
            response = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "lead", "input": "write"})
            run_path = response.headers["content-location"]
            journal = (await http.get(f"{run_path}/journal")).json()
            seqs = [e["seq"] for e in journal]
            assert seqs == sorted(seqs) and journal[0]["kind"] == "run.start" and journal[-1]["kind"] == "run.end"
            tools = (await http.get(f"{run_path}/journal", params={"kind": "tool.call"})).json()
            assert [e["data"]["name"] for e in tools] == ["write_file"]
            changes = (await http.get(f"{run_path}/changes")).json()
            assert len(changes) == 1
            change = changes[0]
            assert change["path"].endswith("outputs/a.txt") and change["change"] == "added"
            assert change["tool_call_id"] == "call_w1" and change["before_sha256"] is None
            assert change["tool_seq"] == tools[0]["seq"] and change["seq"] > change["tool_seq"]
            assert (await http.get(f"/threads/{tid}/runs/{uuid.uuid4()}/changes")).status_code == 404


async def test_a_failing_run_streams_an_error_event(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs/stream", json={"assistant_id": "broken", "input": {}})
    assert response.status_code == 200
    errors = [f for f in parse_sse(response.text) if f.get("event") == "error"]
    assert errors == [
        {"id": errors[0]["id"], "event": "error",
         "data": {"error": "ValueError", "message": "the graph failed on purpose"}}
    ]


async def test_trimmed_events_are_announced_by_a_gap(tmp_path: Path, fresh_mode: None) -> None:
    config = make_config(tmp_path, limits={"stream_retention": 2, "stream_heartbeat_s": 0.2})
    async with open_runtime(config) as rt:
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            tid = await new_thread(rt)
            response = await http.post(f"/threads/{tid}/runs/stream",
                                       json={"assistant_id": "echo", "input": {"steps": 4}, "stream_mode": "custom"})
            replay = parse_sse((await http.get(response.headers["location"], headers={"Last-Event-ID": "-1"})).text)
            # metadata is 1-0, the four custom events 2-0..5-0; two are retained
            assert replay[0] == {"event": "gap", "data": {"requested_after": 0, "resumed_at": 4, "missed": 3}}
            assert [f["id"] for f in replay[1:]] == ["4-0", "5-0"]


async def test_a_reaped_stream_is_answered_from_the_run_record(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs/stream", json=ECHO)
    run_id = response.headers["content-location"].rsplit("/", 1)[1]
    streamed = [f for f in parse_sse(response.text) if "id" in f]
    await runtime.bridge.delete(run_id)
    replay = parse_sse((await client.get(response.headers["location"], headers={"Last-Event-ID": "-1"})).text)
    # History was asked for and is gone: a gap says so (never a silent truncation), exactly, then
    # the state the run ended with (no id: the client's Last-Event-ID stays put), then the record.
    assert [f["event"] for f in replay] == ["gap", "values", "run_record"]
    last = int(streamed[-1]["id"].split("-")[0])
    assert replay[0]["data"] == {"requested_after": 0, "resumed_at": last + 1, "missed": last}
    joined = (await client.get(response.headers["content-location"] + "/join")).json()  # what /join answers
    assert "id" not in replay[1] and replay[1]["data"] == streamed[-1]["data"] == joined
    assert joined["steps"] == 2
    assert replay[2]["data"]["run_id"] == run_id and replay[2]["data"]["status"] == "success"
    assert parse_sse((await client.get(response.headers["location"])).text) == []  # a live join: nothing


async def test_a_user_assistant_runs_its_graph_with_its_context(client: httpx.AsyncClient, runtime: Runtime) -> None:
    created = await client.post("/assistants", json={"graph_id": "echo", "context": {"tone": "dry", "lang": "en"}})
    assert created.status_code == 200, created.text
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": created.json()["assistant_id"], "input": {"steps": 1}, "context": {"lang": "fr"},
    })
    assert response.json() == {"steps": 1, "log": ["stepped"]}
    run = (await client.get(response.headers["content-location"])).json()
    assert run["assistant_id"] == "echo"
    assert run["kwargs"]["context"] == {"tone": "dry", "lang": "fr"}  # the request's keys win
