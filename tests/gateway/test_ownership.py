"""Ownership: every published route tried as the wrong user.

Alice builds a world (a thread with a finished run, a queued run on a second thread, state, an
assistant, a store item), each carrying a marker. Bob then calls every route of ``/openapi.json``
on it: a route naming one of Alice's resources answers 404 and changes nothing; a listing, search
or count shows none of it; nothing Bob receives carries the marker. A route the tables below do not
classify fails the suite, so a new route cannot skip the check. An admin sees everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from test_auth_support import auth_client

from agentkeel.runtime.records import RunStatus

ALICE, BOB, ROOT = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210", "root-key-00112233445566778899"
KEYS = {"mode": "api_keys", "api_keys": [
    {"user": "alice", "key_env": "KEEL_KEY_ALICE"}, {"user": "bob", "key_env": "KEEL_KEY_BOB"},
    {"user": "root", "key_env": "KEEL_KEY_ROOT", "permissions": ["admin"]},
]}
AS_ALICE, AS_BOB, AS_ROOT = ({"x-api-key": key} for key in (ALICE, BOB, ROOT))
MARK = "alice-private-7d1f"
RUN = {"assistant_id": "who", "input": {}}

# Routes naming one of Alice's resources: (method, path) -> JSON body (None: no body).
NAMED: dict[tuple[str, str], Any] = {
    ("get", "/threads/{thread_id}"): None,
    ("patch", "/threads/{thread_id}"): {"metadata": {"taken": "by bob"}},
    ("delete", "/threads/{thread_id}"): None,
    ("post", "/threads/{thread_id}/copy"): None,
    ("get", "/threads/{thread_id}/state"): None,
    ("post", "/threads/{thread_id}/state"): {"values": {"who": "bob"}},
    ("get", "/threads/{thread_id}/state/{checkpoint_id}"): None,
    ("post", "/threads/{thread_id}/state/checkpoint"): {"checkpoint": {"checkpoint_id": "{checkpoint_id}"}},
    ("get", "/threads/{thread_id}/history"): None,
    ("post", "/threads/{thread_id}/history"): {},
    ("get", "/threads/{thread_id}/stream"): None,
    ("get", "/threads/{thread_id}/runs"): None,
    ("post", "/threads/{thread_id}/runs"): RUN,
    ("post", "/threads/{thread_id}/runs/stream"): RUN,
    ("post", "/threads/{thread_id}/runs/wait"): RUN,
    ("get", "/threads/{thread_id}/runs/{run_id}"): None,
    ("delete", "/threads/{thread_id}/runs/{run_id}"): None,
    ("post", "/threads/{thread_id}/runs/{run_id}/cancel"): None,
    ("get", "/threads/{thread_id}/runs/{run_id}/join"): None,
    ("get", "/threads/{thread_id}/runs/{run_id}/stream"): None,
    ("post", "/threads/{thread_id}/runs/{run_id}/stream"): None,
    ("get", "/threads/{thread_id}/runs/{run_id}/journal"): None,
    ("get", "/threads/{thread_id}/runs/{run_id}/changes"): None,
    ("get", "/console/api/threads/{thread_id}/runs/{run_id}/timeline"): None,
    ("get", "/runs/{run_id}"): None,
    ("get", "/runs/{run_id}/join"): None,
    ("get", "/runs/{run_id}/stream"): None,
    ("post", "/runs/{run_id}/stream"): None,
    ("get", "/assistants/{assistant_id}"): None,
    ("patch", "/assistants/{assistant_id}"): {"metadata": {"taken": "by bob"}},
    ("delete", "/assistants/{assistant_id}"): None,
    ("get", "/assistants/{assistant_id}/graph"): None,
    ("get", "/assistants/{assistant_id}/schemas"): None,
    ("get", "/assistants/{assistant_id}/subgraphs"): None,
    ("get", "/assistants/{assistant_id}/subgraphs/{namespace}"): None,
    ("post", "/assistants/{assistant_id}/versions"): {},
    ("post", "/assistants/{assistant_id}/latest"): {"version": 1},
}
# Routes that name no resource in their path, each tried below with Alice's ids in the body.
UNNAMED = {
    ("post", "/threads"), ("post", "/threads/search"), ("post", "/threads/count"),
    ("post", "/runs"), ("post", "/runs/stream"), ("post", "/runs/wait"), ("post", "/runs/cancel"),
    ("post", "/assistants"), ("post", "/assistants/search"), ("post", "/assistants/count"),
    ("get", "/store/items"), ("put", "/store/items"), ("delete", "/store/items"),
    ("post", "/store/items/search"), ("post", "/store/namespaces"), ("get", "/console/api/runs"),
}
SERVICE = {("get", p) for p in ("/ok", "/healthz", "/readyz", "/info", "/metrics")}  # no user data


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, key in (("ALICE", ALICE), ("BOB", BOB), ("ROOT", ROOT)):
        monkeypatch.setenv(f"KEEL_KEY_{name}", key)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.request.method, response.request.url, response.text)
    return response.json() if response.content else None


async def alice_world(http: httpx.AsyncClient) -> dict[str, str]:
    """Alice's resources, every one carrying ``MARK``; returns their ids."""
    thread = ok(await http.post("/threads", json={"metadata": {"note": MARK}}, headers=AS_ALICE))
    assert thread["metadata"]["owner"] == "alice"
    tid = thread["thread_id"]
    ok(await http.post(f"/threads/{tid}/runs/wait", json={**RUN, "metadata": {"note": MARK}}, headers=AS_ALICE))
    run_id = ok(await http.get(f"/threads/{tid}/runs", headers=AS_ALICE))[0]["run_id"]
    checkpoint = ok(await http.post(f"/threads/{tid}/state", json={"values": {"who": MARK}}, headers=AS_ALICE))
    queued_thread = ok(await http.post("/threads", json={}, headers=AS_ALICE))["thread_id"]
    queued = ok(await http.post(f"/threads/{queued_thread}/runs", json={**RUN, "after_seconds": 3600}, headers=AS_ALICE))
    assistant = ok(await http.post("/assistants", json={"graph_id": "who", "name": MARK, "metadata": {"note": MARK}},
                                   headers=AS_ALICE))
    assert assistant["metadata"]["owner"] == "alice"
    ok(await http.put("/store/items", json={"namespace": ["alice", "notes"], "key": "k", "value": {"note": MARK}},
                      headers=AS_ALICE), 204)
    return {"thread_id": tid, "run_id": run_id, "checkpoint_id": checkpoint["checkpoint"]["checkpoint_id"],
            "queued_thread": queued_thread, "queued_run": queued["run_id"], "assistant_id": assistant["assistant_id"],
            "namespace": "root"}


def fill(template: Any, ids: dict[str, str]) -> Any:
    if isinstance(template, str):
        return template.format(**ids) if "{" in template else template
    if isinstance(template, dict):
        return {k: fill(v, ids) for k, v in template.items()}
    return template


async def call(http: httpx.AsyncClient, method: str, path: str, body: Any, headers: dict[str, str],
               **params: Any) -> httpx.Response:
    return await http.request(method.upper(), path, json=body, params=params or None, headers=headers)


def nothing_of_alices(response: httpx.Response) -> None:
    assert MARK not in response.text, (response.request.url, response.text)


async def test_every_route_refuses_the_wrong_user(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (runtime, http):
        published = {(m, p) for p, ops in (await http.get("/openapi.json")).json()["paths"].items() for m in ops}
        assert published == set(NAMED) | UNNAMED | SERVICE, "classify every route in this suite"
        ids = await alice_world(http)

        for (method, path), body in NAMED.items():
            for thread, run in ((ids["thread_id"], ids["run_id"]), (ids["queued_thread"], ids["queued_run"])):
                target = fill(path, {**ids, "thread_id": thread, "run_id": run})
                response = await call(http, method, target, fill(body, ids), AS_BOB)
                assert response.status_code == 404, (method, target, response.status_code, response.text)
                nothing_of_alices(response)

        # Alice's ids in bodies and queries instead of paths.
        tid, qtid = ids["thread_id"], ids["queued_thread"]
        for body in ({"thread_id": tid}, {"thread_id": qtid}, {"run_ids": [ids["queued_run"]]}, {"status": "all"},
                     {"status": "pending"}):
            response = await http.post("/runs/cancel", json=body, headers=AS_BOB)
            assert response.status_code == 404, (body, response.text)
            nothing_of_alices(response)
        for params in ({}, {"q": tid}, {"status": "pending"}):  # the console's run list
            response = await http.get("/console/api/runs", params=params, headers=AS_BOB)
            nothing_of_alices(response)
            assert ok(response) == [], (params, response.text)
        for path in ("/runs", "/runs/stream", "/runs/wait"):
            response = await http.post(path, json={**RUN, "config": {"configurable": {"thread_id": tid}}}, headers=AS_BOB)
            assert response.status_code == 404, (path, response.text)
        assert (await http.post("/threads", json={"thread_id": tid, "if_exists": "do_nothing"},
                                headers=AS_BOB)).status_code == 409  # an id is taken, but nothing is shown
        assert (await http.post("/assistants", json={"graph_id": "who", "assistant_id": ids["assistant_id"],
                                                     "if_exists": "do_nothing"}, headers=AS_BOB)).status_code == 409
        for path, body in (("/threads/search", {}), ("/threads/search", {"ids": [tid, qtid]}),
                           ("/threads/search", {"metadata": {"note": MARK}}), ("/assistants/search", {}),
                           ("/store/items/search", {}), ("/store/namespaces", {})):
            response = await http.post(path, json=body, headers=AS_BOB)
            nothing_of_alices(response)
            assert ok(response) in ([], {"items": []}, {"namespaces": []}) or path == "/assistants/search", response.text
        assert ok(await http.post("/threads/count", json={}, headers=AS_BOB)) == 0
        assert ok(await http.post("/assistants/count", json={"metadata": {"note": MARK}}, headers=AS_BOB)) == 0
        for method, body, params in (
            ("get", None, {"namespace": "alice.notes", "key": "k"}),
            ("put", {"namespace": ["alice", "notes"], "key": "k", "value": {"x": 1}}, {}),
            ("delete", {"namespace": ["alice", "notes"], "key": "k"}, {}),
        ):
            response = await call(http, method, "/store/items", body, AS_BOB, **params)
            assert response.status_code == 404, (method, response.text)
        assert (await http.post("/store/items/search", json={"namespace_prefix": ["alice"]},
                                headers=AS_BOB)).status_code == 404

        # Nothing changed: Alice's world is as she left it.
        thread = ok(await http.get(f"/threads/{tid}", headers=AS_ALICE))
        assert thread["metadata"]["note"] == MARK and "taken" not in thread["metadata"]
        assert thread["values"] == {"who": MARK}
        assert (await runtime.store.get(ids["queued_run"])).status is RunStatus.pending  # type: ignore[union-attr]
        assert len(ok(await http.get(f"/threads/{tid}/runs", headers=AS_ALICE))) == 1
        assistant = ok(await http.get(f"/assistants/{ids['assistant_id']}", headers=AS_ALICE))
        assert "taken" not in assistant["metadata"] and assistant["version"] == 1
        item = ok(await http.get("/store/items", params={"namespace": "alice.notes", "key": "k"}, headers=AS_ALICE))
        assert item["value"] == {"note": MARK}
        assert ok(await http.post("/threads/count", json={}, headers=AS_ALICE)) == 2


async def test_an_admin_sees_and_acts_on_everyones(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        ids = await alice_world(http)
        found = ok(await http.post("/threads/search", json={"metadata": {"note": MARK}}, headers=AS_ROOT))
        assert [t["thread_id"] for t in found] == [ids["thread_id"]]
        assert ok(await http.get(f"/threads/{ids['thread_id']}/runs/{ids['run_id']}", headers=AS_ROOT))["run_id"]
        assert ok(await http.post("/assistants/count", json={"metadata": {"note": MARK}}, headers=AS_ROOT)) == 1
        ok(await http.post(f"/threads/{ids['queued_thread']}/runs/{ids['queued_run']}/cancel", headers=AS_ROOT), 202)
        ok(await http.patch("/assistants/who", json={"description": "by root"}, headers=AS_ROOT))
        assert (await http.patch("/assistants/who", json={"description": "by bob"}, headers=AS_BOB)).status_code == 403
        copied = ok(await http.post(f"/threads/{ids['thread_id']}/copy", headers=AS_ROOT))
        assert copied["metadata"]["owner"] == "root"  # the copy is the admin's own


async def test_owners_are_stamped_and_cannot_be_forged(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (runtime, http):
        forged = await http.post("/threads", json={"metadata": {"owner": "alice"}}, headers=AS_BOB)
        assert forged.status_code == 422 and "metadata.owner" in forged.json()["detail"]
        own = ok(await http.post("/threads", json={"metadata": {"owner": "bob"}}, headers=AS_BOB))
        moved = await http.patch(f"/threads/{own['thread_id']}", json={"metadata": {"owner": "alice"}}, headers=AS_BOB)
        assert moved.status_code == 422
        ok(await http.post("/threads/new-by-run/runs/wait", json={**RUN, "if_not_exists": "create"}, headers=AS_BOB))
        assert (await runtime.store.get_thread("new-by-run")).metadata["owner"] == "bob"  # type: ignore[union-attr]
        assert (await http.get("/threads/new-by-run", headers=AS_ALICE)).status_code == 404
        refused = await http.post("/threads/refused/runs", json={**RUN, "input": {"x": 1}, "command": {"resume": 1},
                                                                 "if_not_exists": "create"}, headers=AS_BOB)
        assert refused.status_code == 422 and await runtime.store.get_thread("refused") is None  # nothing left
        stateless = ok(await http.post("/runs", json={**RUN, "on_completion": "keep"}, headers=AS_ALICE))
        assert (await runtime.store.get_thread(stateless["thread_id"])).metadata["owner"] == "alice"  # type: ignore[union-attr]
        assert (await http.get(f"/runs/{stateless['run_id']}", headers=AS_BOB)).status_code == 404
        ok(await http.put("/store/items", json={"namespace": ["bob"], "key": "k", "value": {}}, headers=AS_BOB), 204)
        assert (await http.put("/store/items", json={"namespace": ["shared"], "key": "k", "value": {}},
                               headers=AS_BOB)).status_code == 404
        assert ok(await http.post("/store/namespaces", json={}, headers=AS_BOB)) == {"namespaces": [["bob"]]}
