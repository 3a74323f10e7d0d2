"""``auth.mode: api_keys`` against a real ``keel serve`` process, driven by the official client:
``get_client(api_key=...)`` sends ``x-api-key``, creates and streams runs, and the key's user is
the run's user; without a key (or with another's) the SDK gets its ``AuthenticationError``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import AuthenticationError, NotFoundError
from server_support import KeelServer, collect, events, start_server, write_project

ALICE, BOB = "alice-sdk-key-0123456789", "bob-sdk-key-9876543210"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    auth = {"mode": "api_keys", "api_keys": [{"user": "alice", "key_env": "KEEL_SDK_KEY_ALICE"},
                                             {"user": "bob", "key_env": "KEEL_SDK_KEY_BOB"}]}
    config = write_project(tmp_path_factory.mktemp("keel-auth"), auth=auth)
    server = start_server(config, env_extra={"KEEL_SDK_KEY_ALICE": ALICE, "KEEL_SDK_KEY_BOB": BOB})
    yield server
    server.stop()


@pytest.fixture
async def alice(auth_server: KeelServer) -> AsyncIterator[Any]:
    client = get_client(url=auth_server.url, api_key=ALICE)
    try:
        yield client
    finally:
        await client.aclose()


async def test_the_sdk_with_a_key_creates_and_streams_a_run_as_its_user(alice: Any, auth_server: KeelServer) -> None:
    thread = await alice.threads.create()
    parts = await collect(alice.runs.stream(thread["thread_id"], "echo", input={"steps": 2}, stream_mode=["values"]))
    assert events(parts)[0] == "metadata" and "values" in events(parts)
    run_id = parts[0].data["run_id"]
    run = await alice.runs.get(thread["thread_id"], run_id)
    assert run["status"] == "success" and run["kwargs"]["user"] == "alice"

    bob = get_client(url=auth_server.url, api_key=BOB)
    try:
        with pytest.raises(NotFoundError):  # alice's thread is not bob's to run on
            await bob.runs.create(thread["thread_id"], "echo", input={"steps": 1})
        own = await bob.threads.create()
        waited = await bob.runs.create(own["thread_id"], "echo", input={"steps": 1})
        assert waited["kwargs"]["user"] == "bob" and own["metadata"]["owner"] == "bob"
        await bob.runs.join(own["thread_id"], waited["run_id"])
    finally:
        await bob.aclose()


async def test_the_sdk_without_a_valid_key_is_refused(auth_server: KeelServer) -> None:
    for key in (None, "not-a-key"):
        client = get_client(url=auth_server.url, api_key=key)
        try:
            with pytest.raises(AuthenticationError):
                await client.threads.create()
            with pytest.raises(AuthenticationError):
                await collect(client.runs.stream(None, "echo", input={"steps": 1}))
        finally:
            await client.aclose()
    async with httpx.AsyncClient(base_url=auth_server.url, timeout=10) as http:
        assert (await http.get("/ok")).status_code == 200
        denied = await http.post("/threads", json={})
        assert denied.status_code == 401 and denied.json() == {"detail": denied.json()["detail"]}
        assert denied.headers["www-authenticate"].startswith("Bearer")
