"""The console's routes in-process with ``auth.mode: api_keys``: the page and its assets are open,
its data routes need a key and show a caller only the runs of threads it owns (an admin every
run), filters narrow the list, and a run's timeline is a 404 to anyone but its owner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from test_auth_support import auth_client, refused

ALICE, BOB, ROOT = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210", "root-key-00112233445566778899"
KEYS = {"mode": "api_keys", "api_keys": [
    {"user": "alice", "key_env": "KEEL_KEY_ALICE"}, {"user": "bob", "key_env": "KEEL_KEY_BOB"},
    {"user": "root", "key_env": "KEEL_KEY_ROOT", "permissions": ["admin"]},
]}


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for user, key in (("ALICE", ALICE), ("BOB", BOB), ("ROOT", ROOT)):
        monkeypatch.setenv(f"KEEL_KEY_{user}", key)


def _as(key: str) -> dict[str, str]:
    return {"x-api-key": key}


async def _owned_run(http: httpx.AsyncClient, key: str, owner: str) -> dict[str, Any]:
    """A finished ``who`` run on a new thread whose metadata names ``owner``."""
    thread = (await http.post("/threads", json={"metadata": {"owner": owner}}, headers=_as(key))).json()
    waited = await http.post(f"/threads/{thread['thread_id']}/runs/wait", json={"assistant_id": "who", "input": {}}, headers=_as(key))
    assert waited.status_code == 200, waited.text
    return (await http.get(f"/threads/{thread['thread_id']}/runs", headers=_as(key))).json()[0]


async def test_the_page_is_open_and_strict_the_data_needs_a_key(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        page = await http.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert 'src="console/assets/console.js"' in page.text
        for asset, kind in (("console.js", "text/javascript"), ("api.js", "text/javascript"), ("console.css", "text/css")):
            answer = await http.get(f"/console/assets/{asset}")
            assert answer.status_code == 200 and answer.headers["content-type"].startswith(kind), asset
        assert (await http.get("/console/assets/missing.js")).status_code == 404
        assert (await http.get("/console/assets/keel.db")).status_code == 404  # only the shipped kinds
        assert "missing API key" in refused(await http.get("/console/api/runs"))
        assert "missing API key" in refused(await http.get("/console/api/threads/t/runs/r/timeline"))


async def test_runs_are_listed_to_their_owner_and_to_admins(tmp_path: Path) -> None:
    async with auth_client(tmp_path, KEYS) as (_runtime, http):
        mine = await _owned_run(http, ALICE, "alice")
        theirs = await _owned_run(http, BOB, "bob")

        async def listed(key: str, **query: str) -> list[str]:
            answer = await http.get("/console/api/runs", params=query, headers=_as(key))
            assert answer.status_code == 200, answer.text
            return [run["run_id"] for run in answer.json()]

        assert await listed(ALICE) == [mine["run_id"]]
        assert await listed(BOB) == [theirs["run_id"]]
        assert await listed(ROOT) == [theirs["run_id"], mine["run_id"]]  # newest first
        assert await listed(ROOT, q=mine["thread_id"][:8]) == [mine["run_id"]]
        assert await listed(ROOT, status="error") == []
        assert await listed(ROOT, stop_reason="none", assistant_id="who") == [theirs["run_id"], mine["run_id"]]
        assert await listed(ROOT, limit="1", offset="1") == [mine["run_id"]]
        row = (await http.get("/console/api/runs", headers=_as(ALICE))).json()[0]
        assert row["status"] == "success" and row["duration_s"] >= 0 and row["total_tokens"] == 0

        path = f"/console/api/threads/{mine['thread_id']}/runs/{mine['run_id']}/timeline"
        assert (await http.get(path, headers=_as(BOB))).status_code == 404
        for key in (ALICE, ROOT):
            doc = (await http.get(path, headers=_as(key))).json()
            assert doc["run"]["run_id"] == mine["run_id"] and doc["run"]["subagents"] == []
            assert doc["manifest"] is None and doc["changes"] == [] and doc["last_seq"] >= 1
            assert doc["clean"] is True and doc["resume_checkpoint_id"]
        bad = await http.get("/console/api/runs", params={"status": "finished"}, headers=_as(ALICE))
        assert bad.status_code == 422 and bad.json()["field"] == "status"
