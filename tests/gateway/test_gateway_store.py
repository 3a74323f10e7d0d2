"""Store routes: LangGraph's key-value store over HTTP, shared with the graphs."""

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


@pytest.mark.parametrize("db", DATABASES)
async def test_put_get_search_list_delete(keel: Keel) -> None:
    http = keel.http
    put = await http.put("/store/items", json={"namespace": ["users", "u1"], "key": "prefs", "value": {"theme": "dark"}})
    assert put.status_code == 204 and put.content == b""
    await http.put("/store/items", json={"namespace": ["users", "u2"], "key": "prefs", "value": {"theme": "light"}})
    await http.put("/store/items", json={"namespace": ["docs"], "key": "d1", "value": {"text": "hello"}, "index": False})

    item = (await http.get("/store/items", params={"namespace": "users.u1", "key": "prefs"})).json()
    assert item["namespace"] == ["users", "u1"] and item["key"] == "prefs"
    assert item["value"] == {"theme": "dark"} and item["created_at"] and item["updated_at"]
    missing = await http.get("/store/items", params={"namespace": "users.u1", "key": "nope"})
    assert missing.status_code == 200 and missing.json() is None

    found = (await http.post("/store/items/search", json={"namespace_prefix": ["users"]})).json()["items"]
    assert sorted(i["namespace"][1] for i in found) == ["u1", "u2"]
    filtered = (await http.post("/store/items/search", json={"namespace_prefix": ["users"], "filter": {"theme": "light"}})).json()
    assert [i["namespace"] for i in filtered["items"]] == [["users", "u2"]]
    everything = (await http.post("/store/items/search", json={"limit": 1, "offset": 1})).json()["items"]
    assert len(everything) == 1
    queried = (await http.post("/store/items/search", json={"namespace_prefix": ["docs"], "query": "hello"})).json()
    assert [i["key"] for i in queried["items"]] == ["d1"]

    namespaces = (await http.post("/store/namespaces", json={})).json()["namespaces"]
    assert sorted(namespaces) == [["docs"], ["users", "u1"], ["users", "u2"]]
    shallow = (await http.post("/store/namespaces", json={"prefix": ["users"], "max_depth": 1})).json()
    assert shallow["namespaces"] == [["users"]]
    suffixed = (await http.post("/store/namespaces", json={"suffix": ["u2"]})).json()
    assert suffixed["namespaces"] == [["users", "u2"]]

    deleted = await http.request("DELETE", "/store/items", json={"namespace": ["users", "u1"], "key": "prefs"})
    assert deleted.status_code == 204
    assert (await http.get("/store/items", params={"namespace": "users.u1", "key": "prefs"})).json() is None


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("PUT", "/store/items", {"namespace": ["a.b"], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": [], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": ["a", ""], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": [1]}, "value"),
        ("PUT", "/store/items", {"namespace": ["a"], "value": {}}, "key"),
        ("PUT", "/store/items", {"namespace": ["langgraph"], "key": "k", "value": {}}, "namespace"),
        ("DELETE", "/store/items", {"namespace": ["x.y"], "key": "k"}, "namespace"),
        ("POST", "/store/items/search", {"namespace_prefix": ["a.b"]}, "namespace_prefix"),
        ("POST", "/store/items/search", {"limit": -1}, "limit"),
        ("POST", "/store/items/search", {"filter": {"": 1}}, "filter"),  # a 500 on SQLite, found by the fuzzer
        ("POST", "/store/items/search", {"filter": {"a b": 1}}, "filter"),
        ("POST", "/store/items/search", {"filter": {"n": {"$near": 1}}}, "filter"),  # a 500 on SQLite too
        ("POST", "/store/namespaces", {"prefix": ["a.b"]}, "prefix"),
        ("POST", "/store/namespaces", {"max_depth": 0}, "max_depth"),
    ],
)
async def test_invalid_requests_name_the_field(keel: Keel, method: str, path: str, body: dict, field: str) -> None:
    response = await keel.http.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert field in response.text


async def test_get_with_an_empty_namespace_is_refused(keel: Keel) -> None:
    response = await keel.http.get("/store/items", params={"namespace": "", "key": "k"})
    assert response.status_code == 422 and "namespace" in response.text


async def test_ttl_on_memory_is_refused(keel: Keel) -> None:
    response = await keel.http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": {}, "ttl": 5})
    assert response.status_code == 422 and "ttl" in response.text


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_ttl_and_persistence_on_sql(keel_factory: KeelFactory) -> None:
    async with keel_factory() as keel:
        put = await keel.http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": {"v": 1}, "ttl": 5})
        assert put.status_code == 204
    async with keel_factory() as keel:  # reopened: the item is still there
        item = (await keel.http.get("/store/items", params={"namespace": "a", "key": "k", "refresh_ttl": "true"})).json()
        assert item["value"] == {"v": 1}


@pytest.mark.parametrize("db", DATABASES)
async def test_graphs_read_the_same_store(keel: Keel) -> None:
    await keel.http.put("/store/items", json={"namespace": ["memories"], "key": "favourite", "value": {"text": "tea"}})
    await keel.run("t-recall", "recall", {})
    state = await keel.runtime.accessor("recall")
    snapshot = await state.aget("t-recall")
    assert snapshot is not None and snapshot.values["note"] == "tea"


async def test_sdk_store_client(keel: Keel) -> None:
    async with keel.sdk() as client:
        await client.store.put_item(["users", "u1"], "prefs", {"theme": "dark"})
        item = await client.store.get_item(["users", "u1"], "prefs")
        assert item is not None and item["value"] == {"theme": "dark"}
        found = await client.store.search_items(["users"], filter={"theme": "dark"})
        assert [i["key"] for i in found["items"]] == ["prefs"]
        assert (await client.store.list_namespaces(prefix=["users"]))["namespaces"] == [["users", "u1"]]
        await client.store.delete_item(["users", "u1"], "prefs")
        assert await client.store.get_item(["users", "u1"], "prefs") is None
