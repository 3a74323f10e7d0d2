"""Thread state and history routes: read at the head or a checkpoint, update, history."""

from __future__ import annotations

import pytest
from test_gateway_threads_support import (  # noqa: F401
    DATABASES,
    Keel,
    KeelFactory,
    db,
    fresh_mode,
    keel,
    keel_factory,
)

STATE_KEYS = {
    "values", "next", "tasks", "metadata", "created_at", "checkpoint", "parent_checkpoint", "interrupts",
    "checkpoint_id", "parent_checkpoint_id",
}


async def test_state_of_a_thread_without_checkpoints(keel: Keel) -> None:
    await keel.http.post("/threads", json={"thread_id": "t-new"})
    state = (await keel.http.get("/threads/t-new/state")).json()
    assert state.keys() == STATE_KEYS
    assert state["values"] == {} and state["next"] == [] and state["checkpoint_id"] is None
    assert state["checkpoint"]["thread_id"] == "t-new"
    assert (await keel.http.post("/threads/t-new/history", json={})).json() == []
    assert (await keel.http.get("/threads/t-new/state/1f0-missing")).status_code == 404
    assert (await keel.http.get("/threads/nope/state")).status_code == 404
    assert (await keel.http.get("/threads/nope/history")).status_code == 404


@pytest.mark.parametrize("db", DATABASES)
async def test_state_at_head_and_at_checkpoints(keel: Keel) -> None:
    http = keel.http
    await keel.run("t-s", "echo", {"items": ["a"]})
    await keel.run("t-s", "echo", {"items": ["b"]})
    head = (await http.get("/threads/t-s/state")).json()
    assert head.keys() == STATE_KEYS
    assert head["values"] == {"items": ["a", "x", "b", "x"]}
    assert head["next"] == [] and head["tasks"] == [] and head["interrupts"] == []
    assert head["checkpoint"] == {
        "thread_id": "t-s", "checkpoint_ns": "", "checkpoint_id": head["checkpoint_id"], "checkpoint_map": None
    }
    assert head["parent_checkpoint"]["checkpoint_id"] == head["parent_checkpoint_id"]
    assert head["metadata"]["source"] == "loop" and head["created_at"]

    history = (await http.get("/threads/t-s/history", params={"limit": 100})).json()
    assert history[0]["checkpoint_id"] == head["checkpoint_id"]  # newest first
    assert len(history) == 6  # per run: input, START -> add, add
    first_run_end = history[3]
    assert first_run_end["values"] == {"items": ["a", "x"]}
    at = (await http.get(f"/threads/t-s/state/{first_run_end['checkpoint_id']}")).json()
    assert at["values"] == {"items": ["a", "x"]}
    posted = await http.post("/threads/t-s/state/checkpoint", json={"checkpoint": first_run_end["checkpoint"]})
    assert posted.json()["checkpoint_id"] == first_run_end["checkpoint_id"]

    limited = (await http.post("/threads/t-s/history", json={"limit": 2})).json()
    assert [h["checkpoint_id"] for h in limited] == [h["checkpoint_id"] for h in history[:2]]
    before = (await http.post("/threads/t-s/history", json={"before": history[1]["checkpoint_id"]})).json()
    assert before[0]["checkpoint_id"] == history[2]["checkpoint_id"]
    before_ref = (await http.post("/threads/t-s/history", json={"before": history[1]["checkpoint"]})).json()
    assert before_ref == before
    inputs = (await http.post("/threads/t-s/history", json={"metadata": {"source": "input"}})).json()
    assert [h["metadata"]["source"] for h in inputs] == ["input", "input"]
    assert (await http.get("/threads/t-s/history", params={"limit": 0})).status_code == 422
    bad_key = await http.post("/threads/t-s/history", json={"metadata": {"": 1}})  # a 500 on SQLite (the fuzzer)
    assert bad_key.status_code == 422 and "metadata" in bad_key.text, bad_key.text


async def test_interrupted_state_and_select(keel: Keel) -> None:
    await keel.run("t-i", "hitl", {"items": []})
    state = (await keel.http.get("/threads/t-i/state")).json()
    assert state["next"] == ["ask"]
    [task] = state["tasks"]
    assert task["name"] == "ask" and task["interrupts"][0]["value"] == {"question": "approve?"}
    assert {"id", "name", "path", "error", "interrupts", "checkpoint", "state", "result"} == task.keys()
    assert state["interrupts"] == task["interrupts"]
    selected = await keel.http.get("/threads/t-i/state", params={"select": ["next", "values.items"]})
    assert selected.json() == {"next": ["ask"], "values": {"items": []}}
    subgraphs = await keel.http.get("/threads/t-i/state", params={"subgraphs": "true"})
    assert subgraphs.json()["next"] == ["ask"]


async def test_subgraph_state(keel: Keel) -> None:
    await keel.run("t-n", "nested", {"items": []})
    flat = (await keel.http.get("/threads/t-n/state")).json()
    [task] = flat["tasks"]
    assert task["name"] == "child" and task["state"] is None
    assert task["checkpoint"]["checkpoint_ns"].startswith("child:")
    deep = (await keel.http.get("/threads/t-n/state", params={"subgraphs": "true"})).json()
    nested = deep["tasks"][0]["state"]
    assert nested["next"] == ["inner"] and nested["tasks"][0]["interrupts"][0]["value"] == {"question": "approve?"}
    assert deep["tasks"][0]["checkpoint"] == nested["checkpoint"]
    child = await keel.http.post("/threads/t-n/state/checkpoint", json={"checkpoint": task["checkpoint"]})
    assert child.status_code == 200 and child.json()["next"] == ["inner"]


@pytest.mark.parametrize("db", DATABASES)
async def test_update_state(keel: Keel) -> None:
    http = keel.http
    await keel.run("t-u", "echo", {"items": ["a"]})
    old = (await http.get("/threads/t-u/state")).json()
    updated = await http.post("/threads/t-u/state", json={"values": {"items": ["edit"]}, "as_node": "add"})
    assert updated.status_code == 200, updated.text
    checkpoint = updated.json()["checkpoint"]
    assert checkpoint["thread_id"] == "t-u" and checkpoint["checkpoint_id"] != old["checkpoint_id"]
    head = (await http.get("/threads/t-u/state")).json()
    assert head["values"] == {"items": ["a", "x", "edit"]}
    assert head["checkpoint_id"] == checkpoint["checkpoint_id"] and head["metadata"]["source"] == "update"

    # From an older checkpoint: a fork whose parent is that checkpoint.
    fork = await http.post(
        "/threads/t-u/state", json={"values": {"items": ["fork"]}, "as_node": "add", "checkpoint_id": old["checkpoint_id"]}
    )
    forked = (await http.get("/threads/t-u/state")).json()
    assert forked["checkpoint_id"] == fork.json()["checkpoint"]["checkpoint_id"]
    assert forked["values"] == {"items": ["a", "x", "fork"]}
    assert forked["parent_checkpoint_id"] == old["checkpoint_id"]


async def test_update_state_refusals(keel: Keel) -> None:
    http = keel.http
    await keel.run("t-r", "echo", {"items": ["a"]})
    missing = await http.post("/threads/t-r/state", json={"values": {}, "as_node": "add", "checkpoint_id": "1f0-nope"})
    assert missing.status_code == 404
    bad_node = await http.post("/threads/t-r/state", json={"values": {"items": ["z"]}, "as_node": "nope"})
    assert bad_node.status_code == 422 and "as_node" in bad_node.text
    subgraph = await http.post(
        "/threads/t-r/state", json={"values": {}, "checkpoint": {"checkpoint_ns": "child:1"}}
    )
    assert subgraph.status_code == 422 and "checkpoint_ns" in subgraph.text
    assert (await http.post("/threads/nope/state", json={"values": {}})).status_code == 404

    record = await keel.start("t-r", "echo", {"items": [], "delay": 30})
    await keel.running(record.run_id)
    busy = await http.post("/threads/t-r/state", json={"values": {"items": ["z"]}, "as_node": "add"})
    assert busy.status_code == 409
    await keel.runtime.manager.cancel(record.run_id)


async def test_answering_an_interrupt_by_update_settles_the_thread(keel: Keel) -> None:
    await keel.run("t-a", "hitl", {"items": []})
    assert (await keel.http.get("/threads/t-a")).json()["status"] == "interrupted"
    answered = await keel.http.post("/threads/t-a/state", json={"values": {"answer": "yes"}, "as_node": "ask"})
    assert answered.status_code == 200
    thread = (await keel.http.get("/threads/t-a")).json()
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    assert thread["values"]["answer"] == "yes"


@pytest.mark.parametrize("db", DATABASES)
async def test_delta_mode_threads_read_and_copy(keel_factory: KeelFactory) -> None:
    async with keel_factory(checkpoint_mode="delta") as keel:
        await keel.run("t-d", "lead", {"messages": [{"role": "user", "content": "hi"}]})
        await keel.run("t-d", "lead", {"messages": [{"role": "user", "content": "again"}]})
        state = (await keel.http.get("/threads/t-d/state")).json()
        contents = [m["content"] for m in state["values"]["messages"]]
        assert contents == ["hi", "All done.", "again", "All done."]
        copied = (await keel.http.post("/threads/t-d/copy")).json()
        assert [m["content"] for m in copied["values"]["messages"]] == contents
        source = (await keel.http.post("/threads/t-d/history", json={"limit": 100})).json()
        copy = (await keel.http.post(f"/threads/{copied['thread_id']}/history", json={"limit": 100})).json()
        assert [h["values"] for h in copy] == [h["values"] for h in source]
        assert len(source) > 4


async def test_sdk_state_and_history(keel: Keel) -> None:
    async with keel.sdk() as client:
        thread = await client.threads.create(graph_id="echo")
        thread_id = thread["thread_id"]
        await keel.run(thread_id, "echo", {"items": ["a"]})
        state = await client.threads.get_state(thread_id)
        assert state["values"] == {"items": ["a", "x"]}
        history = await client.threads.get_history(thread_id, limit=5)
        assert history[0]["checkpoint_id"] == state["checkpoint_id"]
        older = await client.threads.get_state(thread_id, checkpoint_id=history[1]["checkpoint_id"])
        assert older["checkpoint_id"] == history[1]["checkpoint_id"]
        by_ref = await client.threads.get_state(thread_id, checkpoint=history[1]["checkpoint"])
        assert by_ref["values"] == older["values"]
        result = await client.threads.update_state(thread_id, {"items": ["sdk"]}, as_node="add")
        assert result["checkpoint"]["checkpoint_id"]
        assert (await client.threads.get_state(thread_id))["values"]["items"][-1] == "sdk"
        before = await client.threads.get_history(thread_id, before=history[0]["checkpoint"], limit=1)
        assert before[0]["checkpoint_id"] == history[1]["checkpoint_id"]
