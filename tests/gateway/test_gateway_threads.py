"""Thread routes: create, read, update, delete, search, count, copy."""

from __future__ import annotations

import uuid

import pytest
from test_gateway_threads_support import (  # noqa: F401
    DATABASES,
    Keel,
    db,
    fresh_mode,
    keel,
    keel_factory,
)

from agentkeel.runtime.threads import thread_dir


async def test_create_get_patch_delete(keel: Keel) -> None:
    http = keel.http
    created = (await http.post("/threads", json={"metadata": {"graph_id": "echo", "k": 1}})).json()
    thread_id = created["thread_id"]
    assert uuid.UUID(thread_id)
    assert created["status"] == "idle"
    assert created["values"] is None  # no run yet
    assert created["interrupts"] == {} and created["error"] is None
    assert {"created_at", "updated_at", "state_updated_at", "config"} <= created.keys()

    got = await http.get(f"/threads/{thread_id}")
    assert got.status_code == 200 and got.json()["metadata"] == {"graph_id": "echo", "k": 1}

    patched = await http.patch(f"/threads/{thread_id}", json={"metadata": {"k": 2, "new": True}})
    assert patched.json()["metadata"] == {"graph_id": "echo", "k": 2, "new": True}
    minimal = await http.patch(
        f"/threads/{thread_id}", json={"metadata": {"m": 1}}, headers={"Prefer": "return=minimal"}
    )
    assert minimal.status_code == 204 and minimal.content == b""

    assert (await http.delete(f"/threads/{thread_id}")).status_code == 204
    missing = await http.get(f"/threads/{thread_id}")
    assert missing.status_code == 404 and thread_id in missing.json()["detail"]
    assert (await http.delete(f"/threads/{thread_id}")).status_code == 204  # missing: still 204
    assert (await http.patch(f"/threads/{thread_id}", json={"metadata": {}})).status_code == 404


async def test_create_with_an_existing_id(keel: Keel) -> None:
    first = await keel.http.post("/threads", json={"thread_id": "t-dup", "metadata": {"a": 1}})
    assert first.status_code == 200
    again = await keel.http.post("/threads", json={"thread_id": "t-dup", "metadata": {"a": 2}})
    assert again.status_code == 409
    kept = await keel.http.post(
        "/threads", json={"thread_id": "t-dup", "metadata": {"a": 3}, "if_exists": "do_nothing"}
    )
    assert kept.status_code == 200 and kept.json()["metadata"] == {"a": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"thread_id": "../escape"}, "thread_id"),
        ({"ttl": {"ttl": 5, "strategy": "delete"}}, "ttl"),
        ({"if_exists": "replace"}, "if_exists"),
        ({"metadata": [1]}, "metadata"),
        ({"supersteps": [{"updates": [{"values": {}, "command": {"resume": 1}, "as_node": "add"}]}]}, "command"),
    ],
)
async def test_invalid_create_bodies_name_the_field(keel: Keel, body: dict, field: str) -> None:
    response = await keel.http.post("/threads", json=body)
    assert response.status_code == 422, response.text
    assert field in response.text
    assert await keel.runtime.store.list_threads() == []


async def test_thread_after_runs_shows_values_status_and_interrupts(keel: Keel) -> None:
    await keel.run("t-echo", "echo", {"items": ["a"]})
    thread = (await keel.http.get("/threads/t-echo")).json()
    assert thread["values"] == {"items": ["a", "x"]}
    assert thread["status"] == "idle"

    await keel.run("t-ask", "hitl", {"items": []})
    asked = (await keel.http.get("/threads/t-ask")).json()
    assert asked["status"] == "interrupted"
    [interrupts] = asked["interrupts"].values()
    assert interrupts[0]["value"] == {"question": "approve?"} and interrupts[0]["id"]


async def test_supersteps_seed_the_state(keel: Keel) -> None:
    body = {
        "thread_id": "t-seeded",
        "metadata": {"graph_id": "echo"},
        "supersteps": [
            {"updates": [{"values": {"items": ["one"]}, "as_node": "add"}]},
            {"updates": [{"values": {"items": ["two"]}, "as_node": "add"}]},
        ],
    }
    created = await keel.http.post("/threads", json=body)
    assert created.status_code == 200, created.text
    assert created.json()["values"] == {"items": ["one", "two"]}
    history = (await keel.http.post("/threads/t-seeded/history", json={})).json()
    assert [(h["metadata"]["source"], h["values"]) for h in history] == [
        ("update", {"items": ["one", "two"]}), ("update", {"items": ["one"]})
    ]

    bad = {**body, "thread_id": "t-bad", "supersteps": [{"updates": [{"values": {}, "as_node": "nope"}]}]}
    refused = await keel.http.post("/threads", json=bad)
    assert refused.status_code == 422 and "supersteps" in refused.text
    assert (await keel.http.get("/threads/t-bad")).status_code == 404


async def test_search_and_count(keel: Keel) -> None:
    http = keel.http
    for index, colour in enumerate(["red", "red", "blue"]):
        await http.post("/threads", json={"thread_id": f"s-{index}", "metadata": {"colour": colour, "graph_id": "echo"}})
    await keel.run("s-0", "echo", {"items": ["a"]})

    found = await http.post("/threads/search", json={"metadata": {"colour": "red"}, "limit": 1})
    assert found.headers["X-Pagination-Total"] == "2" and found.headers["X-Pagination-Next"] == "1"
    assert len(found.json()) == 1

    ordered = await http.post("/threads/search", json={"sort_by": "thread_id", "sort_order": "asc"})
    assert [t["thread_id"] for t in ordered.json()] == ["s-0", "s-1", "s-2"]
    by_ids = await http.post("/threads/search", json={"ids": ["s-2", "nope", "s-1"], "sort_by": "thread_id"})
    assert [t["thread_id"] for t in by_ids.json()] == ["s-2", "s-1"]
    by_values = await http.post("/threads/search", json={"values": {"items": ["a", "x"]}})
    assert [t["thread_id"] for t in by_values.json()] == ["s-0"]
    selected = await http.post("/threads/search", json={"ids": ["s-0"], "select": ["thread_id", "status"]})
    assert selected.json() == [{"thread_id": "s-0", "status": "idle"}]

    assert (await http.post("/threads/count", json={})).json() == 3
    assert (await http.post("/threads/count", json={"metadata": {"colour": "blue"}})).json() == 1
    assert (await http.post("/threads/count", json={"status": "busy"})).json() == 0
    bad = await http.post("/threads/search", json={"status": "sleeping"})
    assert bad.status_code == 422 and "status" in bad.text
    assert (await http.post("/threads/search", json={"extract": {"x": "values.x"}})).status_code == 422


@pytest.mark.parametrize("db", DATABASES)
async def test_copy_carries_checkpoints_files_and_metadata(keel: Keel) -> None:
    http = keel.http
    await http.post("/threads", json={"thread_id": "t-src", "metadata": {"graph_id": "echo", "k": "v"}})
    await keel.run("t-src", "echo", {"items": ["a"]})
    await keel.run("t-src", "echo", {"items": ["b"]})
    workspace = thread_dir(keel.runtime, "t-src") / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text("kept")

    copied = (await http.post("/threads/t-src/copy")).json()
    copy_id = copied["thread_id"]
    assert copy_id != "t-src"
    assert copied["metadata"] == {"graph_id": "echo", "k": "v"}
    assert copied["values"] == {"items": ["a", "x", "b", "x"]}
    assert copied["status"] == "idle"
    source_history = (await http.post("/threads/t-src/history", json={"limit": 100})).json()
    copy_history = (await http.post(f"/threads/{copy_id}/history", json={"limit": 100})).json()
    assert [h["checkpoint_id"] for h in copy_history] == [h["checkpoint_id"] for h in source_history]
    assert [h["values"] for h in copy_history] == [h["values"] for h in source_history]
    assert (thread_dir(keel.runtime, copy_id) / "workspace" / "notes.txt").read_text() == "kept"

    await keel.run(copy_id, "echo", {"items": ["c"]})  # the copy lives on independently
    assert (await http.get(f"/threads/{copy_id}")).json()["values"]["items"][-2:] == ["c", "x"]
    assert (await http.get("/threads/t-src")).json()["values"] == {"items": ["a", "x", "b", "x"]}
    assert (await http.post("/threads/nope/copy")).status_code == 404


async def test_copy_of_an_interrupted_thread_keeps_its_interrupt(keel: Keel) -> None:
    await keel.run("t-ask", "hitl", {"items": []})
    copied = (await keel.http.post("/threads/t-ask/copy")).json()
    assert copied["status"] == "interrupted"
    assert copied["metadata"] == {"graph_id": "hitl"}  # told by the source's run, kept by the copy
    assert list(copied["interrupts"]) == list((await keel.http.get("/threads/t-ask")).json()["interrupts"])


@pytest.mark.parametrize("db", DATABASES)
async def test_delete_removes_runs_checkpoints_and_files(keel: Keel) -> None:
    record = await keel.run("t-del", "echo", {"items": ["a"]})
    (thread_dir(keel.runtime, "t-del") / "workspace").mkdir(parents=True)
    assert (await keel.http.delete("/threads/t-del")).status_code == 204
    assert await keel.runtime.store.get(record.run_id) is None
    assert await keel.runtime.checkpointer.aget_tuple({"configurable": {"thread_id": "t-del", "checkpoint_ns": ""}}) is None
    assert not thread_dir(keel.runtime, "t-del").exists()


async def test_delete_cancels_an_active_run_first(keel: Keel) -> None:
    record = await keel.start("t-busy", "echo", {"items": [], "delay": 30})
    await keel.running(record.run_id)
    assert (await keel.http.get("/threads/t-busy")).json()["status"] == "busy"
    assert (await keel.http.delete("/threads/t-busy")).status_code == 204
    assert keel.runtime.manager.active(record.run_id) is None  # finalized before the delete
    assert (await keel.http.get("/threads/t-busy")).status_code == 404
    assert await keel.runtime.store.get(record.run_id) is None


async def test_sdk_threads_client(keel: Keel) -> None:
    async with keel.sdk() as client:
        thread = await client.threads.create(metadata={"who": "sdk"}, graph_id="echo")
        thread_id = thread["thread_id"]
        assert thread["metadata"] == {"who": "sdk", "graph_id": "echo"}
        await client.threads.update(thread_id, metadata={"more": 1})
        assert (await client.threads.get(thread_id))["metadata"]["more"] == 1
        assert [t["thread_id"] for t in await client.threads.search(metadata={"who": "sdk"})] == [thread_id]
        assert await client.threads.count(metadata={"who": "sdk"}) == 1
        await keel.run(thread_id, "echo", {"items": ["a"]})
        copied = await client.threads.copy(thread_id)
        assert copied["values"] == {"items": ["a", "x"]}
        await client.threads.delete(thread_id)
        assert await client.threads.count() == 1
