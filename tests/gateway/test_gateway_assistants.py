"""Assistant routes: system and user assistants, versions, search, graph and schemas; resolution."""

from __future__ import annotations

import uuid

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

from agentkeel.runtime.assistants import resolve_assistant
from agentkeel.runtime.requests import RequestError
from agentkeel.runtime.stores.assistants import system_assistant_id

SYSTEM_NS = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
CONFIGURED = ["lead", "echo", "hitl", "recall", "nested"]


async def test_every_configured_name_has_a_system_assistant(keel: Keel) -> None:
    found = await keel.http.post("/assistants/search", json={"limit": 100, "sort_by": "name", "sort_order": "asc"})
    assert found.headers["X-Pagination-Total"] == str(len(CONFIGURED))
    by_graph = {a["graph_id"]: a for a in found.json()}
    assert sorted(by_graph) == sorted(CONFIGURED)
    for name, assistant in by_graph.items():
        assert assistant["assistant_id"] == str(uuid.uuid5(SYSTEM_NS, name))
        assert assistant["metadata"] == {"created_by": "system"} and assistant["version"] == 1
    by_name = (await keel.http.get("/assistants/echo")).json()
    assert by_name == by_graph["echo"]
    assert (await keel.http.get(f"/assistants/{by_graph['echo']['assistant_id']}")).json() == by_name
    missing = await keel.http.get("/assistants/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


async def test_system_assistants_cannot_be_deleted_or_moved(keel: Keel) -> None:
    assert (await keel.http.delete("/assistants/echo")).status_code == 409
    moved = await keel.http.patch("/assistants/echo", json={"graph_id": "hitl"})
    assert moved.status_code == 409
    patched = await keel.http.patch("/assistants/echo", json={"config": {"tags": ["t"]}})
    assert patched.status_code == 200 and patched.json()["version"] == 2


async def test_user_assistant_lifecycle(keel: Keel) -> None:
    http = keel.http
    created = await http.post(
        "/assistants",
        json={"graph_id": "echo", "config": {"configurable": {"k": 1}}, "context": {"c": 1},
              "metadata": {"owner": "me"}, "name": "Mine", "description": "desc"},
    )
    assert created.status_code == 200, created.text
    body = created.json()
    assistant_id = body["assistant_id"]
    assert uuid.UUID(assistant_id) and body["version"] == 1 and body["name"] == "Mine"
    assert {"created_at", "updated_at"} <= body.keys()

    updated = (await http.patch(f"/assistants/{assistant_id}", json={"metadata": {"extra": 1}, "name": "Mine 2"})).json()
    assert updated["version"] == 2 and updated["metadata"] == {"owner": "me", "extra": 1}
    versions = (await http.post(f"/assistants/{assistant_id}/versions", json={})).json()
    assert [v["version"] for v in versions] == [2, 1]
    back = (await http.post(f"/assistants/{assistant_id}/latest", json={"version": 1})).json()
    assert back["version"] == 1 and back["name"] == "Mine"
    assert (await http.post(f"/assistants/{assistant_id}/latest", json={"version": 5})).status_code == 404

    assert (await http.delete(f"/assistants/{assistant_id}")).status_code == 204
    assert (await http.get(f"/assistants/{assistant_id}")).status_code == 404
    assert (await http.delete(f"/assistants/{assistant_id}")).status_code == 404


async def test_create_refusals_and_if_exists(keel: Keel) -> None:
    http = keel.http
    unknown = await http.post("/assistants", json={"graph_id": "nope"})
    assert unknown.status_code == 422 and "graph_id" in unknown.text and "nope" in unknown.text
    bad_id = await http.post("/assistants", json={"graph_id": "echo", "assistant_id": "not-a-uuid"})
    assert bad_id.status_code == 422 and "assistant_id" in bad_id.text
    assert (await http.post("/assistants", json={})).status_code == 422
    fixed = str(uuid.uuid4())
    first = (await http.post("/assistants", json={"graph_id": "echo", "assistant_id": fixed, "name": "a"})).json()
    assert (await http.post("/assistants", json={"graph_id": "echo", "assistant_id": fixed})).status_code == 409
    same = await http.post("/assistants", json={"graph_id": "hitl", "assistant_id": fixed, "if_exists": "do_nothing"})
    assert same.status_code == 200 and same.json() == first
    existing_system = await http.post("/assistants", json={"graph_id": "echo", "assistant_id": system_assistant_id("echo")})
    assert existing_system.status_code == 409


async def test_search_and_count(keel: Keel) -> None:
    http = keel.http
    for index in range(3):
        await http.post("/assistants", json={"graph_id": "hitl", "name": f"user-{index}", "metadata": {"batch": "b"}})
    page = await http.post("/assistants/search", json={"metadata": {"batch": "b"}, "limit": 2, "sort_by": "name", "sort_order": "asc"})
    assert [a["name"] for a in page.json()] == ["user-0", "user-1"]
    assert page.headers["X-Pagination-Total"] == "3" and page.headers["X-Pagination-Next"] == "2"
    last = await http.post("/assistants/search", json={"metadata": {"batch": "b"}, "offset": 2})
    assert len(last.json()) == 1 and "X-Pagination-Next" not in last.headers
    assert [a["name"] for a in (await http.post("/assistants/search", json={"name": "USER-1"})).json()] == ["user-1"]
    selected = (await http.post("/assistants/search", json={"graph_id": "echo", "select": ["assistant_id", "name"]})).json()
    assert selected == [{"assistant_id": system_assistant_id("echo"), "name": "echo"}]
    assert (await http.post("/assistants/count", json={"graph_id": "hitl"})).json() == 4
    assert (await http.post("/assistants/count", json={})).json() == len(CONFIGURED) + 3
    bad = await http.post("/assistants/search", json={"sort_by": "version"})
    assert bad.status_code == 422 and "sort_by" in bad.text
    bad_key = await http.post("/assistants/count", json={"metadata": {'a"b': 1}})
    assert bad_key.status_code == 422 and "metadata" in bad_key.text


async def test_graph_and_schemas(keel: Keel) -> None:
    graph = (await keel.http.get("/assistants/echo/graph")).json()
    assert {n["id"] for n in graph["nodes"]} == {"__start__", "add", "__end__"}
    assert {(e["source"], e["target"]) for e in graph["edges"]} == {("__start__", "add"), ("add", "__end__")}
    assert (await keel.http.get("/assistants/echo/graph", params={"xray": "1"})).status_code == 200
    assert (await keel.http.get("/assistants/echo/graph", params={"xray": "maybe"})).status_code == 422

    schemas = (await keel.http.get(f"/assistants/{system_assistant_id('echo')}/schemas")).json()
    assert schemas["graph_id"] == "echo"
    assert {"input_schema", "output_schema", "state_schema", "config_schema", "context_schema"} <= schemas.keys()
    assert "items" in schemas["input_schema"]["properties"]
    assert "items" in schemas["state_schema"]["properties"]
    lead = (await keel.http.get("/assistants/lead/schemas")).json()
    assert "messages" in lead["state_schema"]["properties"]
    lead_graph = (await keel.http.get("/assistants/lead/graph")).json()
    assert "model" in {n["id"] for n in lead_graph["nodes"]}
    assert (await keel.http.get("/assistants/echo/subgraphs")).json() == {}
    subgraphs = (await keel.http.get("/assistants/nested/subgraphs")).json()
    assert list(subgraphs) == ["child"] and "items" in subgraphs["child"]["state_schema"]["properties"]
    assert list((await keel.http.get("/assistants/nested/subgraphs/child")).json()) == ["child"]
    deep = (await keel.http.get("/assistants/nested/graph", params={"xray": "true"})).json()
    assert "child:inner" in {n["id"] for n in deep["nodes"]}
    assert (await keel.http.get("/assistants/nope/schemas")).status_code == 404


async def test_resolve_assistant(keel: Keel) -> None:
    runtime = keel.runtime
    by_name = await resolve_assistant(runtime, "echo")
    assert by_name == ("echo", {}, {}, system_assistant_id("echo"))
    assert await resolve_assistant(runtime, system_assistant_id("echo")) == by_name
    created = (await keel.http.post(
        "/assistants", json={"graph_id": "hitl", "config": {"tags": ["a"]}, "context": {"c": 1}}
    )).json()
    user = await resolve_assistant(runtime, created["assistant_id"])
    assert user == ("hitl", {"tags": ["a"]}, {"c": 1}, created["assistant_id"])
    with pytest.raises(RequestError) as refused:
        await resolve_assistant(runtime, "nope")
    assert refused.value.field == "assistant_id" and refused.value.problem == "not_found"


async def test_delete_with_threads(keel: Keel) -> None:
    created = (await keel.http.post("/assistants", json={"graph_id": "echo"})).json()
    assistant_id = created["assistant_id"]
    await keel.http.post("/threads", json={"thread_id": "t-mine", "metadata": {"assistant_id": assistant_id}})
    await keel.http.post("/threads", json={"thread_id": "t-other", "metadata": {"assistant_id": "echo"}})
    response = await keel.http.delete(f"/assistants/{assistant_id}", params={"delete_threads": "true"})
    assert response.status_code == 204
    assert (await keel.http.get("/threads/t-mine")).status_code == 404
    assert (await keel.http.get("/threads/t-other")).status_code == 200


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_assistants_persist_across_restarts(keel_factory: KeelFactory) -> None:
    async with keel_factory() as keel:
        created = (await keel.http.post("/assistants", json={"graph_id": "echo", "name": "kept"})).json()
        await keel.http.patch("/assistants/echo", json={"metadata": {"patched": True}})
    async with keel_factory() as keel:
        assert (await keel.http.get(f"/assistants/{created['assistant_id']}")).json()["name"] == "kept"
        echo = (await keel.http.get("/assistants/echo")).json()
        assert echo["version"] == 2 and echo["metadata"] == {"created_by": "system", "patched": True}
        assert (await keel.http.post("/assistants/count", json={})).json() == len(CONFIGURED) + 1


async def test_sdk_assistants_client(keel: Keel) -> None:
    async with keel.sdk() as client:
        echo = await client.assistants.get("echo")
        assert echo["graph_id"] == "echo"
        found = await client.assistants.search(graph_id="echo", response_format="object")
        assert [a["assistant_id"] for a in found["assistants"]] == [echo["assistant_id"]]
        created = await client.assistants.create("hitl", config={"tags": ["a"]}, metadata={"m": 1}, name="sdk")
        updated = await client.assistants.update(created["assistant_id"], metadata={"n": 2})
        assert updated["version"] == 2
        assert [v["version"] for v in await client.assistants.get_versions(created["assistant_id"])] == [2, 1]
        assert (await client.assistants.set_latest(created["assistant_id"], 1))["version"] == 1
        assert await client.assistants.count(graph_id="hitl") == 2
        assert {n["id"] for n in (await client.assistants.get_graph("echo"))["nodes"]} >= {"add"}
        assert (await client.assistants.get_schemas(echo["assistant_id"]))["graph_id"] == "echo"
        assert await client.assistants.get_subgraphs("echo") == {}
        await client.assistants.delete(created["assistant_id"])
        assert await client.assistants.count(graph_id="hitl") == 1
