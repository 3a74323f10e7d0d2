"""``@auth.on`` handlers of ``auth.mode: langgraph`` decide on top of ownership: they stamp
metadata on create, filter what reads and searches see, refuse (False, an exception, an assert),
and rewrite store namespaces; the most specific handler answers."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from test_auth_support import auth_client

from agentkeel.gateway.auth_rules import check_filter, matches

RULES_PY = textwrap.dedent(
    '''
    from langgraph_sdk import Auth

    auth = Auth()
    CALLS = []


    @auth.authenticate
    async def authenticate(headers):
        user = headers.get("x-user")
        if not user:
            raise Auth.exceptions.HTTPException(status_code=401, detail="no x-user")
        return {"identity": user.decode(), "team": "red" if user.startswith(b"r") else "blue"}


    @auth.on
    async def everything(ctx, value):
        CALLS.append((ctx.resource, ctx.action, "global"))


    @auth.on.threads.create
    async def stamp_team(ctx, value):
        CALLS.append((ctx.resource, ctx.action, "threads.create"))
        value["metadata"]["team"] = ctx.user["team"]
        return {"team": ctx.user["team"]}


    @auth.on.threads
    async def same_team(ctx, value):
        CALLS.append((ctx.resource, ctx.action, "threads"))
        if ctx.action == "delete":
            raise Auth.exceptions.HTTPException(status_code=403, detail="threads are kept")
        return {"team": ctx.user["team"], "tags": {"$contains": "visible"}} if ctx.action == "search" else {"team": ctx.user["team"]}


    @auth.on.assistants.create
    async def no_assistants(ctx, value):
        return False


    @auth.on.store
    async def own_namespace(ctx, value):
        assert value["namespace"][:1] != ("forbidden",), "not that one"
        value["namespace"] = (ctx.user.identity, *value["namespace"])
    '''
)
CONFIG = {"mode": "langgraph", "path": "./rules.py:auth"}
RUTH, RITA = {"x-user": "ruth"}, {"x-user": "rita"}


async def test_rules_stamp_filter_refuse_and_rewrite(tmp_path: Path) -> None:
    (tmp_path / "rules.py").write_text(RULES_PY)
    async with auth_client(tmp_path, CONFIG) as (runtime, http):
        made = await http.post("/threads", json={"metadata": {"tags": ["visible"]}}, headers=RUTH)
        assert made.status_code == 200 and made.json()["metadata"] == {"tags": ["visible"], "team": "red", "owner": "ruth"}
        tid = made.json()["thread_id"]
        hidden = (await http.post("/threads", json={"metadata": {"tags": []}}, headers=RUTH)).json()["thread_id"]

        # A filter on search hides what does not match; on read it is what a thread must match.
        found = (await http.post("/threads/search", json={}, headers=RUTH)).json()
        assert [t["thread_id"] for t in found] == [tid]
        assert (await http.post("/threads/count", json={}, headers=RUTH)).json() == 1
        assert (await http.get(f"/threads/{hidden}", headers=RUTH)).status_code == 200
        await runtime.store.upsert_thread(hidden, {"team": "blue"})  # now another team's, though ruth's
        assert (await http.get(f"/threads/{hidden}", headers=RUTH)).status_code == 404
        assert (await http.post(f"/threads/{hidden}/runs", json={"assistant_id": "who", "input": {}},
                                headers=RUTH)).status_code == 404  # create_run falls back to the threads rule

        refused = await http.delete(f"/threads/{tid}", headers=RUTH)
        assert refused.status_code == 403 and refused.json() == {"detail": "threads are kept"}
        assert await runtime.store.get_thread(tid) is not None
        no = await http.post("/assistants", json={"graph_id": "who"}, headers=RUTH)
        assert no.status_code == 403 and "assistants" in no.json()["detail"]

        # Store rule: the namespace is prefixed with the user, which is what ownership asks.
        put = await http.put("/store/items", json={"namespace": ["notes"], "key": "k", "value": {"v": 1}}, headers=RUTH)
        assert put.status_code == 204
        assert (await runtime.kv_store.aget(("ruth", "notes"), "k")) is not None
        got = await http.get("/store/items", params={"namespace": "notes", "key": "k"}, headers=RUTH)
        assert got.json()["value"] == {"v": 1} and got.json()["namespace"] == ["ruth", "notes"]
        assert (await http.get("/store/items", params={"namespace": "notes", "key": "k"}, headers=RITA)).json() is None
        asserted = await http.put("/store/items", json={"namespace": ["forbidden"], "key": "k", "value": {}}, headers=RUTH)
        assert asserted.status_code == 403 and asserted.json() == {"detail": "not that one"}

        calls = set(sys.modules["agentkeel_user_auth_path"].CALLS)
        assert ("threads", "create", "threads.create") in calls and ("threads", "read", "threads") in calls
        assert not any(source == "global" and resource == "threads" for resource, _, source in calls)


def test_filters_match_like_langgraph() -> None:
    metadata = {"owner": "ada", "tags": ["a", "b"], "n": 1}
    assert matches(metadata, None) and matches(metadata, {}) and matches(metadata, {"owner": "ada"})
    assert matches(metadata, {"owner": {"$eq": "ada"}, "tags": {"$contains": "a"}})
    assert matches(metadata, {"tags": {"$contains": ["b", "a"]}})
    assert not matches(metadata, {"tags": {"$contains": ["a", "c"]}}) and not matches(metadata, {"owner": "bob"})
    assert not matches(metadata, {"missing": None}) and not matches(metadata, {"n": {"$contains": 1}})
    for bad in ({"k": {"$in": [1]}}, {"k": {}}, {1: "x"}):
        with pytest.raises(TypeError):
            check_filter(bad)  # type: ignore[arg-type]
