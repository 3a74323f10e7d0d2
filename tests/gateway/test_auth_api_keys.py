"""``auth.mode: api_keys`` in-process: every API route needs a key, the service routes stay open,
refusals are JSON 401s with a challenge, CORS preflights still pass, and the caller the key names
reaches the run (its ``kwargs.user`` and the graph's trusted ``RunContext.user``) whatever the body says."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_auth_support import LOCAL_ORIGIN, auth_client, refused, whoami

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210"
KEYS = {"mode": "api_keys", "api_keys": [{"user": "alice", "key_env": "KEEL_KEY_ALICE"},
                                         {"user": "bob", "key_env": "KEEL_KEY_BOB", "permissions": ["admin"]}]}


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_KEY_ALICE", ALICE)
    monkeypatch.setenv("KEEL_KEY_BOB", BOB)


async def test_routes_need_a_key_and_service_routes_stay_open(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (runtime, http):
        for path in ("/ok", "/healthz", "/readyz", "/info", "/openapi.json", "/docs"):
            assert (await http.get(path)).status_code == 200, path
        assert "missing API key" in refused(await http.post("/threads/search", json={}))
        assert "missing API key" in refused(await http.get("/metrics"))
        assert "missing API key" in refused(await http.get("/no/such/route"))  # nothing about routes leaks
        for wrong in ("nope", ALICE[:-1], ALICE + "x", ALICE.upper(), " "):
            refused(await http.post("/threads/search", json={}, headers={"x-api-key": wrong}))
        refused(await http.post("/threads/search", json={}, headers={"Authorization": f"Basic {ALICE}"}))
        refused(await http.post("/threads", json={"thread_id": "t-refused"}))
        assert await runtime.store.get_thread("t-refused") is None  # nothing was stored

        assert (await http.post("/threads/search", json={}, headers={"x-api-key": ALICE})).status_code == 200
        assert (await http.post("/threads/search", json={}, headers={"Authorization": f"Bearer {BOB}"})).status_code == 200
        assert (await http.get("/metrics", headers={"x-api-key": BOB})).status_code == 200


async def test_a_refused_body_is_never_read(tmp_path: Path) -> None:
    """Authentication runs before the input limits: an oversized body without a key is a 401, not a 413."""
    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        huge = b"{" + b" " * (3 * 1024 * 1024) + b"}"
        refused(await http.post("/threads", content=huge, headers={"content-type": "application/json"}))
        assert (await http.post("/threads", content=huge, headers={"x-api-key": ALICE})).status_code == 413


async def test_the_key_names_the_runs_user_and_the_body_cannot(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        seen, run = await whoami(http, {"x-api-key": ALICE})
        assert seen == "alice" and run["kwargs"]["user"] == "alice"
        seen, run = await whoami(http, {"Authorization": f"Bearer {BOB}"}, context={"user": "alice", "user_id": "alice"},
                                 metadata={"user": "alice"})
        assert seen == "bob" and run["kwargs"]["user"] == "bob" and "user" not in run["kwargs"]["context"]
        seen, run = await whoami(http, {"x-api-key": BOB},
                                 config={"configurable": {"user": "alice", "langgraph_auth_user_id": "alice"}})
        assert seen == "bob" and run["kwargs"]["user"] == "bob"
        configurable = run["kwargs"]["config"]["configurable"]
        assert "user" not in configurable and configurable["langgraph_auth_user_id"] == "bob"  # re-stamped
        assert configurable["langgraph_auth_user"]["identity"] == "bob"
        stateless = await http.post("/runs/wait", json={"assistant_id": "who", "input": {}}, headers={"x-api-key": ALICE})
        assert stateless.status_code == 200 and stateless.json()["who"] == "alice"


async def test_cors_preflight_passes_and_a_refusal_is_readable_cross_origin(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        preflight = await http.options("/threads", headers={
            "Origin": LOCAL_ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-api-key, content-type"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == LOCAL_ORIGIN
        assert "x-api-key" in preflight.headers["access-control-allow-headers"].lower()
        denied = await http.post("/threads", json={}, headers={"Origin": LOCAL_ORIGIN})
        refused(denied)
        assert denied.headers["access-control-allow-origin"] == LOCAL_ORIGIN
        allowed = await http.post("/threads", json={}, headers={"Origin": LOCAL_ORIGIN, "x-api-key": ALICE})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == LOCAL_ORIGIN
        # The Host check still comes first: a rebinding page is refused whatever its credentials.
        assert (await http.post("/threads", json={}, headers={"Host": "evil.example", "x-api-key": ALICE})).status_code == 400


async def test_identity_is_exposed_once_for_later_checks(tmp_path: Path) -> None:
    """``current_user`` is the one place routes read the caller (``request.state.identity``)."""
    from fastapi import Depends

    from agentkeel.gateway.auth import Identity, current_user

    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        app = http._transport.app  # type: ignore[attr-defined]

        @app.get("/whoami-test")
        async def probe(user: Identity | None = Depends(current_user)) -> dict[str, object]:
            assert user is not None
            return {"user": user.user_id, "admin": user.is_admin, "permissions": list(user.permissions)}

        assert (await http.get("/whoami-test", headers={"x-api-key": BOB})).json() == {
            "user": "bob", "admin": True, "permissions": ["admin"]}
        assert (await http.get("/whoami-test", headers={"x-api-key": ALICE})).json()["admin"] is False


@settings(max_examples=300, deadline=None)
@given(guess=st.binary(max_size=64), where=st.sampled_from(["x-api-key", "authorization"]))
def test_no_other_key_passes(guess: bytes, where: str) -> None:
    """Invariant: whatever bytes a caller sends, in either header, only a configured key is a user."""
    from agentkeel.config import AuthConfig
    from agentkeel.gateway.auth import ApiKeys, AuthFailure

    keys = ApiKeys(AuthConfig(**KEYS), {"KEEL_KEY_ALICE": ALICE, "KEEL_KEY_BOB": BOB})
    value = guess if where == "x-api-key" else b"Bearer " + guess
    scope = {"type": "http", "headers": [(where.encode(), value)]}
    expected = {ALICE.encode(): "alice", BOB.encode(): "bob"}.get(guess.strip() if where == "authorization" else guess)
    try:
        got: str | None = asyncio.run(keys(scope)).user_id
    except AuthFailure:
        got = None
    assert got == expected
