"""Assistants (system and user-created, versions, graph and schemas) and the key-value store,
through the official SDK."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

SYSTEM_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")  # the official server's choice
ASSISTANT_KEYS = {"assistant_id", "graph_id", "config", "context", "metadata", "name", "version", "created_at", "updated_at"}


def _system_id(graph_id: str) -> str:
    return str(uuid.uuid5(SYSTEM_NAMESPACE, graph_id))


# -- assistants ------------------------------------------------------------------------------------
@pytest.mark.parametrize("graph_id", ["echo", "chat", "lead"])
async def test_system_assistants_by_name_and_uuid(client: Any, graph_id: str) -> None:
    by_uuid = await client.assistants.get(_system_id(graph_id))
    assert ASSISTANT_KEYS <= set(by_uuid)
    assert by_uuid["graph_id"] == graph_id and by_uuid["metadata"] == {"created_by": "system"}
    assert await client.assistants.get(graph_id) == by_uuid  # AgentKeel also accepts the name
    system = await client.assistants.search(graph_id=graph_id, metadata={"created_by": "system"})
    assert [a["assistant_id"] for a in system] == [_system_id(graph_id)]


async def test_runs_address_an_assistant_by_uuid_or_graph_name(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    assert (await client.runs.wait(tid, _system_id("echo"), input={"steps": 1}))["done"] == 1
    assert (await client.runs.wait(tid, "echo", input={"steps": 2}))["done"] == 2


async def test_create_update_versions_delete(client: Any) -> None:
    tag = uuid.uuid4().hex
    aid = str(uuid.uuid4())
    created = await client.assistants.create(
        "echo", assistant_id=aid, config={"recursion_limit": 50}, context={"style": "terse"},
        metadata={"tag": tag}, name="echo-terse", description="for the tests",
    )
    assert (created["assistant_id"], created["graph_id"], created["version"]) == (aid, "echo", 1)
    assert created["context"] == {"style": "terse"} and created["name"] == "echo-terse"
    with pytest.raises(ConflictError):
        await client.assistants.create("echo", assistant_id=aid)
    assert (await client.assistants.create("chat", assistant_id=aid, if_exists="do_nothing"))["graph_id"] == "echo"

    updated = await client.assistants.update(aid, metadata={"stage": "two"}, name="echo-two")
    assert updated["version"] == 2 and updated["name"] == "echo-two"
    assert updated["metadata"] == {"tag": tag, "stage": "two"}
    versions = await client.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [2, 1]
    latest = await client.assistants.set_latest(aid, 1)
    assert latest["version"] == 1 and latest["name"] == "echo-terse"
    assert (await client.assistants.get(aid))["version"] == 1

    tid = (await client.threads.create())["thread_id"]
    assert (await client.runs.wait(tid, aid, input={"steps": 2}))["done"] == 2
    run = (await client.runs.list(tid))[0]
    assert run["assistant_id"] in (aid, "echo")

    await client.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        await client.assistants.get(aid)


async def test_search_count_and_pages(client: Any) -> None:
    tag = uuid.uuid4().hex
    ids = [(await client.assistants.create("echo", metadata={"tag": tag}, name=f"a{i}"))["assistant_id"] for i in range(3)]
    assert await client.assistants.count(metadata={"tag": tag}) == 3
    assert await client.assistants.count(metadata={"tag": tag}, name="a1") == 1
    assert await client.assistants.count(graph_id="echo", metadata={"tag": tag}) == 3
    by_name = await client.assistants.search(metadata={"tag": tag}, sort_by="name", sort_order="asc")
    assert [a["name"] for a in by_name] == ["a0", "a1", "a2"]
    page = await client.assistants.search(metadata={"tag": tag}, limit=2, response_format="object")
    assert len(page["assistants"]) == 2 and page["next"] == "2"
    rest = await client.assistants.search(metadata={"tag": tag}, limit=2, offset=2, response_format="object")
    assert len(rest["assistants"]) == 1 and rest["next"] is None
    assert {a["assistant_id"] for a in page["assistants"] + rest["assistants"]} == set(ids)
    selected = await client.assistants.search(metadata={"tag": tag}, select=["assistant_id", "name"])
    assert all(set(a) == {"assistant_id", "name"} for a in selected)
    for aid in ids:
        await client.assistants.delete(aid)


async def test_delete_with_threads(client: Any) -> None:
    aid = (await client.assistants.create("echo"))["assistant_id"]
    tid = (await client.threads.create(metadata={"assistant_id": aid}))["thread_id"]
    kept = (await client.threads.create())["thread_id"]
    await client.assistants.delete(aid, delete_threads=True)
    with pytest.raises(NotFoundError):
        await client.threads.get(tid)
    assert (await client.threads.get(kept))["thread_id"] == kept


async def test_graph_schemas_subgraphs(client: Any) -> None:
    graph = await client.assistants.get_graph("echo")
    node_ids = {n["id"] for n in graph["nodes"]}
    assert {"__start__", "step", "__end__"} <= node_ids
    assert {(e["source"], e["target"]) for e in graph["edges"]} >= {("__start__", "step")}
    assert any(e.get("conditional") for e in graph["edges"])

    flat = await client.assistants.get_graph(_system_id("nested"))
    deep = await client.assistants.get_graph("nested", xray=True)
    assert "child" in {n["id"] for n in flat["nodes"]}
    assert "child:inner" in {n["id"] for n in deep["nodes"]}  # xray expands the subgraph's nodes

    schemas = await client.assistants.get_schemas("echo")
    assert {"graph_id", "input_schema", "output_schema", "state_schema", "config_schema", "context_schema"} <= set(schemas)
    assert schemas["graph_id"] == "echo"
    assert {"steps", "custom", "delay", "done", "messages"} <= set(schemas["state_schema"]["properties"])

    subgraphs = await client.assistants.get_subgraphs("nested")
    assert list(subgraphs) == ["child"]
    assert "inner" not in subgraphs["child"].get("state_schema", {}).get("properties", {})  # state, not nodes
    assert await client.assistants.get_subgraphs("echo") == {}


async def test_assistant_errors(client: Any) -> None:
    with pytest.raises(NotFoundError):
        await client.assistants.get(str(uuid.uuid4()))
    with pytest.raises(UnprocessableEntityError):
        await client.assistants.create("no-such-graph")
    with pytest.raises(UnprocessableEntityError):
        await client.assistants.create("echo", assistant_id="not-a-uuid")
    with pytest.raises(ConflictError):
        await client.assistants.delete(_system_id("echo"))  # system assistants stay
    with pytest.raises(NotFoundError):
        await client.assistants.update(str(uuid.uuid4()), metadata={"a": 1})


# -- store -----------------------------------------------------------------------------------------
async def test_store_items(client: Any) -> None:
    space = ["tests", uuid.uuid4().hex]
    assert await client.store.put_item(space, "k1", {"colour": "red", "n": 1}) is None
    await client.store.put_item(space, "k2", {"colour": "blue", "n": 2})
    await client.store.put_item([*space, "sub"], "k3", {"colour": "red", "n": 3})

    item = await client.store.get_item(space, "k1")
    assert {k: item[k] for k in ("namespace", "key", "value")} == {"namespace": space, "key": "k1", "value": {"colour": "red", "n": 1}}
    assert item["created_at"] and item["updated_at"]
    assert await client.store.get_item(space, "missing") is None

    await client.store.put_item(space, "k1", {"colour": "green", "n": 1})
    assert (await client.store.get_item(space, "k1"))["value"]["colour"] == "green"

    everything = (await client.store.search_items(space))["items"]
    assert {i["key"] for i in everything} == {"k1", "k2", "k3"}
    red = (await client.store.search_items(space, filter={"colour": "red"}))["items"]
    assert [i["key"] for i in red] == ["k3"]
    first = (await client.store.search_items(space, limit=2))["items"]
    second = (await client.store.search_items(space, limit=2, offset=2))["items"]
    assert len(first) == 2 and len(second) == 1
    assert {i["key"] for i in first + second} == {"k1", "k2", "k3"}

    await client.store.delete_item(space, "k2")
    assert await client.store.get_item(space, "k2") is None


async def test_store_namespaces(client: Any) -> None:
    root = ["ns", uuid.uuid4().hex]
    for path in (root, [*root, "a"], [*root, "a", "deep"], [*root, "b"]):
        await client.store.put_item(path, "k", {"v": 1})
    found = (await client.store.list_namespaces(prefix=root))["namespaces"]
    assert sorted(found) == sorted([root, [*root, "a"], [*root, "a", "deep"], [*root, "b"]])
    shallow = (await client.store.list_namespaces(prefix=root, max_depth=3))["namespaces"]
    assert sorted(shallow) == sorted([root, [*root, "a"], [*root, "b"]])
    assert (await client.store.list_namespaces(prefix=root, suffix=["deep"]))["namespaces"] == [[*root, "a", "deep"]]
    assert len((await client.store.list_namespaces(prefix=root, limit=2))["namespaces"]) == 2


async def test_store_errors(client: Any) -> None:
    with pytest.raises(UnprocessableEntityError):  # the SDK refuses this itself; the server does too
        await client.http.put("/store/items", json={"namespace": ["has.dot"], "key": "k", "value": {"v": 1}})
    with pytest.raises(UnprocessableEntityError):
        await client.store.put_item([], "k", {"v": 1})
