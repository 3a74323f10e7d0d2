"""Run streams through the official SDK, on SQLite + memory bridge and on PostgreSQL + Redis.

Covers every stream mode and its SSE event names (``|ns`` with ``stream_subgraphs``), event ids,
resumable joins with ``Last-Event-ID`` after the run ended and while it runs, ``/wait`` and
``/join`` bodies, and a failing graph's ``error`` event. These are the paths whose behaviour depends
on the store and the stream bridge, hence both backends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from server_support import KeelServer, collect, events, run_reaches, sdk

REPLY = "Hello from the fake chat model, one token at a time."
HUMAN = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis])],
)
def server(request: pytest.FixtureRequest) -> KeelServer:
    name = "keel_server" if request.param == "sqlite" else "keel_server_pg"
    return request.getfixturevalue(name)


@pytest.fixture
async def client(server: KeelServer) -> AsyncIterator[Any]:
    async with sdk(server.url) as c:
        yield c


async def _thread(client: Any) -> str:
    return (await client.threads.create())["thread_id"]


async def _stream(client: Any, graph: str, input: Any, **kwargs: Any) -> tuple[str, list[Any]]:
    tid = await _thread(client)
    return tid, await collect(client.runs.stream(tid, graph, input=input, **kwargs))


def _id_number(event_id: str) -> int:
    return int(event_id.split("-")[0])


# -- modes -----------------------------------------------------------------------------------------
async def test_values_is_the_default(client: Any) -> None:
    tid, parts = await _stream(client, "echo", {"steps": 2})
    assert events(parts) == ["metadata", "values", "values", "values"]
    run_id = parts[0].data["run_id"]
    assert parts[0].data == {"run_id": run_id, "attempt": 1}
    assert [p.data.get("done", 0) for p in parts[1:]] == [0, 1, 2]
    assert [m["content"] for m in parts[-1].data["messages"]] == ["step 0", "step 1"]
    assert (await client.runs.get(tid, run_id))["status"] == "success"


async def test_updates_and_custom(client: Any) -> None:
    _, parts = await _stream(client, "echo", {"steps": 2, "custom": 3}, stream_mode=["updates", "custom"])
    assert events(parts) == ["metadata"] + ["custom"] * 3 + ["updates"] + ["custom"] * 3 + ["updates"]
    custom = [p.data for p in parts if p.event == "custom"]
    assert custom == [{"step": s, "j": j} for s in range(2) for j in range(3)]
    updates = [p.data for p in parts if p.event == "updates"]
    assert [u["step"]["messages"][0]["content"] for u in updates] == ["step 0", "step 1"]
    assert all(u["step"]["done"] == 1 for u in updates)


async def test_debug_tasks_checkpoints(client: Any) -> None:
    _, debug = await _stream(client, "echo", {"steps": 1}, stream_mode="debug")
    kinds = [p.data["type"] for p in debug if p.event == "debug"]
    assert kinds == ["checkpoint", "checkpoint", "task", "task_result", "checkpoint"]
    assert all({"step", "timestamp", "payload"} <= set(p.data) for p in debug[1:])

    _, tasks = await _stream(client, "echo", {"steps": 1}, stream_mode="tasks")
    start, result = (p.data for p in tasks if p.event == "tasks")
    assert start["name"] == result["name"] == "step" and start["id"] == result["id"]
    assert {"input", "triggers"} <= set(start) and result["error"] is None
    assert result["result"]["done"] == 1

    _, checkpoints = await _stream(client, "echo", {"steps": 1}, stream_mode="checkpoints")
    bodies = [p.data for p in checkpoints if p.event == "checkpoints"]
    assert [b["metadata"]["step"] for b in bodies] == [-1, 0, 1]
    assert all({"config", "parent_config", "values", "metadata", "next"} <= set(b) for b in bodies)
    assert bodies[-1]["next"] == [] and bodies[-1]["values"]["done"] == 1


async def test_all_modes_together(client: Any) -> None:
    modes = ["values", "updates", "custom", "debug", "tasks", "checkpoints"]
    _, parts = await _stream(client, "echo", {"steps": 1, "custom": 1}, stream_mode=modes)
    assert parts[0].event == "metadata"
    assert set(events(parts)) == {"metadata", *modes}


async def test_events_mode_over_http(client: Any) -> None:
    _, parts = await _stream(client, "echo", {"steps": 1, "custom": 1}, stream_mode=["events", "custom"])
    assert parts[0].event == "metadata" and set(events(parts)) == {"metadata", "events", "custom"}
    langchain = [p.data for p in parts if p.event == "events"]
    assert langchain[0]["event"] == "on_chain_start" and langchain[-1]["event"] == "on_chain_end"
    assert any(e["event"] == "on_chain_start" and e["name"] == "step" for e in langchain)
    assert [p.data for p in parts if p.event == "custom"] == [{"step": 0, "j": 0}]


async def test_messages_tuple(client: Any) -> None:
    _, parts = await _stream(client, "chat", HUMAN, stream_mode="messages-tuple")
    assert parts[0].event == "metadata" and set(events(parts[1:])) == {"messages"}
    assert len(parts) > 5  # one frame per token, not one per message
    chunks = [p.data for p in parts[1:]]
    assert all(chunk["type"] == "AIMessageChunk" and meta["langgraph_node"] == "model" for chunk, meta in chunks)
    assert "".join(chunk["content"] for chunk, _ in chunks) == REPLY


async def test_messages(client: Any) -> None:
    _, parts = await _stream(client, "chat", HUMAN, stream_mode="messages")
    names = events(parts)
    assert names[:2] == ["metadata", "messages/metadata"] and set(names[2:]) == {"messages/partial"}
    message_id = parts[2].data[0]["id"]
    assert message_id in parts[1].data and parts[1].data[message_id]["metadata"]["langgraph_node"] == "model"
    contents = [p.data[0]["content"] for p in parts[2:]]
    assert contents[-1] == REPLY
    assert all(REPLY.startswith(c) for c in contents) and contents == sorted(contents, key=len)


async def test_subgraph_namespaces(client: Any) -> None:
    modes = ["values", "updates", "custom"]
    _, flat = await _stream(client, "nested", {"steps": 1}, stream_mode=modes)
    assert not any("|" in name for name in events(flat))
    _, parts = await _stream(client, "nested", {"steps": 1}, stream_mode=modes, stream_subgraphs=True)
    namespaced = [p for p in parts if "|" in p.event]
    assert {p.event.split("|")[0] for p in namespaced} == set(modes)
    assert all(p.event.split("|")[1].startswith("child:") for p in namespaced)
    assert [p.data for p in namespaced if p.event.startswith("custom|")] == [{"from": "inner"}]
    assert [p.event for p in parts if "|" not in p.event] == ["metadata", "values", "updates", "values"]


async def test_event_ids_are_unique_and_increasing(client: Any) -> None:
    _, parts = await _stream(client, "echo", {"steps": 3, "custom": 20}, stream_mode=["updates", "custom"])
    ids = [_id_number(p.id) for p in parts]
    assert ids == sorted(set(ids)) and len(ids) == 1 + 3 * 21


# -- failures, waits and joins ---------------------------------------------------------------------
async def test_failing_graph(client: Any) -> None:
    tid, parts = await _stream(client, "broken", {})
    assert events(parts) == ["metadata", "error"]
    assert parts[-1].data == {"error": "ValueError", "message": "the graph failed on purpose"}
    run = await client.runs.get(tid, parts[0].data["run_id"])
    assert run["status"] == "error" and "the graph failed on purpose" in run["error"]
    thread = await client.threads.get(tid)
    assert thread["status"] == "error"

    body = await client.runs.wait(tid, "broken", input={}, raise_error=False)
    assert body == {"__error__": {"error": "ValueError", "message": "the graph failed on purpose"}}
    with pytest.raises(Exception, match="ValueError: the graph failed on purpose"):
        await client.runs.wait(tid, "broken", input={})


async def test_wait_and_join(client: Any) -> None:
    tid = await _thread(client)
    created: list[dict[str, Any]] = []
    result = await client.runs.wait(tid, "echo", input={"steps": 2}, on_run_created=created.append)
    assert result["done"] == 2 and len(result["messages"]) == 2
    assert created and created[0]["thread_id"] == tid
    assert await client.runs.join(tid, created[0]["run_id"]) == result  # a finished run joins at once

    run = await client.runs.create(tid, "echo", input={"steps": 5, "delay": 0.05})
    assert run["status"] in ("pending", "running")
    joined = await asyncio.wait_for(client.runs.join(tid, run["run_id"]), 20)
    assert joined["done"] == 5  # `done` counts on from 2 until it reaches `steps`
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"


# -- resumable joins -------------------------------------------------------------------------------
async def test_join_after_the_run_ended_replays_after_last_event_id(client: Any) -> None:
    tid, parts = await _stream(client, "echo", {"steps": 3, "custom": 5}, stream_mode=["updates", "custom"])
    run_id = parts[0].data["run_id"]
    assert len(parts) == 19

    def replay(last_event_id: str, **kw: Any) -> Any:
        return collect(client.runs.join_stream(tid, run_id, last_event_id=last_event_id, **kw), timeout=15)

    for k in (0, 7, len(parts) - 2, len(parts) - 1):
        assert await replay(parts[k].id) == parts[k + 1 :], k
    for from_start in ("-1", "0-0", "0"):
        assert await replay(from_start) == parts, from_start
    only_custom = await replay(parts[0].id, stream_mode="custom")
    assert only_custom == [p for p in parts if p.event == "custom"]
    # without Last-Event-ID a join of a finished run gets nothing, and ends
    assert await collect(client.runs.join_stream(tid, run_id), timeout=15) == []


async def test_join_while_running_resumes_exactly(client: Any) -> None:
    tid = await _thread(client)
    run = await client.runs.create(
        tid, "echo", input={"steps": 30, "delay": 0.03, "custom": 1}, stream_mode=["updates", "custom"]
    )
    run_id = run["run_id"]
    everything = asyncio.ensure_future(collect(client.runs.join_stream(tid, run_id, last_event_id="-1"), timeout=30))

    first: list[Any] = []
    live = client.runs.join_stream(tid, run_id)
    async for part in live:
        first.append(part)
        if len(first) == 5:
            break
    await live.aclose()
    assert (await client.runs.get(tid, run_id))["status"] == "running"
    rest = await collect(client.runs.join_stream(tid, run_id, last_event_id=first[-1].id), timeout=30)

    full = await everything
    assert events(full[:1]) == ["metadata"] and events(full).count("custom") == 30
    start = full.index(first[0])
    assert first + rest == full[start:]
    assert (await run_reaches(client, tid, run_id, "success"))["status"] == "success"


async def test_stream_resumable_flag_is_accepted(client: Any) -> None:
    _, parts = await _stream(client, "echo", {"steps": 1}, stream_mode="updates", stream_resumable=True)
    assert events(parts) == ["metadata", "updates"] and all(p.id for p in parts)
