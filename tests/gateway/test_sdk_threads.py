"""Threads through the official SDK against a real ``keel serve``: lifecycle, search, state, history.

Every test makes its own threads (unique ids and a metadata tag), so they share one server.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

THREAD_KEYS = {"thread_id", "created_at", "updated_at", "metadata", "status", "values", "interrupts"}
STATE_KEYS = {"values", "next", "tasks", "metadata", "created_at", "checkpoint", "parent_checkpoint"}


def _tag() -> str:
    return uuid.uuid4().hex


async def test_thread_lifecycle(client: Any) -> None:
    tag, tid = _tag(), str(uuid.uuid4())
    created = await client.threads.create(thread_id=tid, metadata={"tag": tag, "n": 1})
    assert THREAD_KEYS <= set(created)
    assert (created["thread_id"], created["status"], created["values"]) == (tid, "idle", None)
    assert created["metadata"]["tag"] == tag

    with pytest.raises(ConflictError):
        await client.threads.create(thread_id=tid)
    existing = await client.threads.create(thread_id=tid, if_exists="do_nothing", metadata={"ignored": True})
    assert existing["metadata"] == created["metadata"]

    got = await client.threads.get(tid)
    assert got["thread_id"] == tid and got["metadata"] == created["metadata"]

    updated = await client.threads.update(tid, metadata={"n": 2, "extra": True})
    assert updated["metadata"] == {**created["metadata"], "n": 2, "extra": True}
    assert await client.threads.update(tid, metadata={"m": 3}, return_minimal=True) is None
    assert (await client.threads.get(tid))["metadata"]["m"] == 3

    await client.threads.delete(tid)
    with pytest.raises(NotFoundError):
        await client.threads.get(tid)
    await client.threads.delete(tid)  # deleting a missing thread is not an error (204)


async def test_create_with_graph_id_and_supersteps(client: Any) -> None:
    thread = await client.threads.create(
        graph_id="echo", supersteps=[{"updates": [{"values": {"done": 3}, "as_node": "step"}]}]
    )
    assert thread["metadata"]["graph_id"] == "echo"
    state = await client.threads.get_state(thread["thread_id"])
    assert state["values"]["done"] == 3


async def test_invalid_and_missing_threads(client: Any) -> None:
    with pytest.raises(UnprocessableEntityError):
        await client.threads.create(thread_id="not a valid id!")
    missing = str(uuid.uuid4())
    for call in (
        client.threads.get(missing),
        client.threads.get_state(missing),
        client.threads.get_history(missing),
        client.threads.copy(missing),
        client.threads.update(missing, metadata={"a": 1}),
        client.runs.list(missing),
    ):
        with pytest.raises(NotFoundError):
            await call


async def test_search_and_count(client: Any) -> None:
    tag = _tag()
    ids = []
    for kind in ("a", "a", "b"):
        ids.append((await client.threads.create(metadata={"tag": tag, "kind": kind}))["thread_id"])
    await client.runs.wait(ids[2], "echo", input={"steps": 1})

    found = await client.threads.search(metadata={"tag": tag}, limit=10)
    assert {t["thread_id"] for t in found} == set(ids)
    assert await client.threads.count(metadata={"tag": tag}) == 3
    assert await client.threads.count(metadata={"tag": tag, "kind": "a"}) == 2
    assert await client.threads.count(metadata={"tag": tag}, status="idle") == 3
    assert await client.threads.count(metadata={"tag": tag}, values={"done": 1}) == 1
    by_values = await client.threads.search(metadata={"tag": tag}, values={"done": 1})
    assert [t["thread_id"] for t in by_values] == [ids[2]]
    assert by_values[0]["values"]["done"] == 1

    pages = [await client.threads.search(metadata={"tag": tag}, limit=1, offset=i) for i in range(3)]
    assert sorted(p[0]["thread_id"] for p in pages) == sorted(ids)
    assert await client.threads.search(metadata={"tag": tag}, limit=1, offset=3) == []

    oldest_first = await client.threads.search(metadata={"tag": tag}, sort_by="created_at", sort_order="asc")
    assert [t["thread_id"] for t in oldest_first] == ids
    chosen = await client.threads.search(ids=[ids[0], ids[2]], metadata={"tag": tag})
    assert {t["thread_id"] for t in chosen} == {ids[0], ids[2]}
    selected = await client.threads.search(metadata={"tag": tag}, select=["thread_id", "metadata"])
    assert all(set(t) == {"thread_id", "metadata"} for t in selected)


async def test_state_history_and_checkpoints(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    result = await client.runs.wait(tid, "echo", input={"steps": 2})
    assert result["done"] == 2 and [m["content"] for m in result["messages"]] == ["step 0", "step 1"]

    state = await client.threads.get_state(tid)
    assert STATE_KEYS <= set(state)
    assert state["values"]["done"] == 2 and state["next"] == []
    assert state["checkpoint"]["thread_id"] == tid and state["checkpoint"]["checkpoint_id"]

    history = await client.threads.get_history(tid)
    assert [h["values"].get("done", 0) for h in history] == [2, 1, 0, 0]  # newest first; input, then steps
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert [h["metadata"]["step"] for h in history] == [2, 1, 0, -1]
    assert len(await client.threads.get_history(tid, limit=2)) == 2
    before = await client.threads.get_history(tid, before=history[0]["checkpoint"])
    assert [h["checkpoint"]["checkpoint_id"] for h in before] == [h["checkpoint"]["checkpoint_id"] for h in history[1:]]
    loops = await client.threads.get_history(tid, metadata={"source": "loop"})
    assert loops and all(h["metadata"]["source"] == "loop" for h in loops)

    older = history[1]
    by_id = await client.threads.get_state(tid, checkpoint_id=older["checkpoint"]["checkpoint_id"])
    assert by_id["values"]["done"] == 1 and by_id["next"] == ["step"]
    by_checkpoint = await client.threads.get_state(tid, checkpoint=older["checkpoint"])
    assert by_checkpoint["checkpoint"]["checkpoint_id"] == older["checkpoint"]["checkpoint_id"]
    with pytest.raises(NotFoundError):
        await client.threads.get_state(tid, checkpoint_id=str(uuid.uuid4()))

    # update the head as if `step` had returned these values (`done` adds up)
    updated = await client.threads.update_state(tid, {"done": 5}, as_node="step")
    assert updated["checkpoint"]["thread_id"] == tid
    assert (await client.threads.get_state(tid))["values"]["done"] == 7
    # update an older checkpoint (by id, or by the checkpoint object): a fork that becomes the head
    await client.threads.update_state(tid, {"done": 10}, as_node="step", checkpoint_id=older["checkpoint"]["checkpoint_id"])
    assert (await client.threads.get_state(tid))["values"]["done"] == 11
    await client.threads.update_state(tid, {"done": 20}, as_node="step", checkpoint=older["checkpoint"])
    assert (await client.threads.get_state(tid))["values"]["done"] == 21
    with pytest.raises(UnprocessableEntityError):
        await client.threads.update_state(tid, {"done": 1}, as_node="no-such-node")

    # a run forked from an older checkpoint starts from its values
    forked = await client.runs.wait(tid, "echo", input={"steps": 2}, checkpoint_id=older["checkpoint"]["checkpoint_id"])
    assert forked["done"] == 2


async def test_copy_is_independent(client: Any) -> None:
    source = (await client.threads.create(metadata={"tag": _tag()}))["thread_id"]
    await client.runs.wait(source, "echo", input={"steps": 1})
    copied = await client.threads.copy(source)
    assert copied["thread_id"] != source
    source_metadata = (await client.threads.get(source))["metadata"]
    assert source_metadata.items() <= copied["metadata"].items()  # plus the graph it runs, for state reads
    assert (await client.threads.get_state(copied["thread_id"]))["values"] == (await client.threads.get_state(source))["values"]
    await client.runs.wait(copied["thread_id"], "echo", input={"steps": 2})
    assert (await client.threads.get_state(source))["values"]["done"] == 1
    assert (await client.threads.get_state(copied["thread_id"]))["values"]["done"] == 2


async def test_update_state_refused_while_a_run_is_active(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "echo", input={"steps": 20, "delay": 0.05})
    with pytest.raises(ConflictError):
        await client.threads.update_state(tid, {"done": 1}, as_node="step")
    await client.runs.cancel(tid, run["run_id"], wait=True)
