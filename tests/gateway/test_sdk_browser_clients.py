"""What browser chat UIs (``useStream``, LangChain's Agent Chat UI) need from the gateway, checked
against a real ``keel serve`` with the official SDK and raw HTTP: CORS preflights, JSON sent as
``text/plain``, threads findable by the graph that ran on them, and a resume sent with ``input: {}``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import KeelServer

from agentkeel.config import KeelConfig
from agentkeel.gateway.app import create_app

LOCAL_PAGE = "http://localhost:5173"  # a dev server's origin: another port than the API's


def _preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "content-type,x-api-key",
    }


async def test_a_preflight_from_a_local_page_is_answered(keel_server: KeelServer) -> None:
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        answer = await http.options("/threads/search", headers=_preflight(LOCAL_PAGE))
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == LOCAL_PAGE
    assert "POST" in answer.headers["access-control-allow-methods"]
    allowed = {h.strip() for h in answer.headers["access-control-allow-headers"].lower().split(",")}
    assert allowed >= {"content-type", "x-api-key"}


async def test_a_local_page_can_read_the_headers_the_sdk_reads(keel_server: KeelServer) -> None:
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        created = await http.post(
            f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {"steps": 1}},
            headers={"Origin": "http://127.0.0.1:3000"},
        )
    assert created.status_code == 200
    assert created.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
    exposed = {h.strip().lower() for h in created.headers["access-control-expose-headers"].split(",")}
    assert {"content-location", "location", "x-pagination-total", "x-pagination-next"} <= exposed
    assert created.headers["content-location"].endswith(created.json()["run_id"])


async def test_a_page_on_another_site_is_refused_by_default(keel_server: KeelServer) -> None:
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        preflight = await http.options("/threads", headers=_preflight("https://evil.example"))
        simple = await http.get("/ok", headers={"Origin": "https://evil.example"})
    assert preflight.status_code == 400
    assert "access-control-allow-origin" not in preflight.headers
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers


@pytest.mark.parametrize(
    ("origins", "origin", "allowed"),
    [
        (["https://chat.example.com"], "https://chat.example.com", "https://chat.example.com"),
        (["https://chat.example.com"], LOCAL_PAGE, None),  # a list replaces the loopback default
        (["*"], "https://anywhere.example", "*"),
        ([], LOCAL_PAGE, None),  # no browser origin at all
    ],
)
async def test_configured_origins_decide(tmp_path: Path, origins: list[str], origin: str, allowed: str | None) -> None:
    """Preflights are answered before routing, so the app needs no running runtime here."""
    config = KeelConfig.model_validate({"data_dir": str(tmp_path), "gateway": {"cors": {"allow_origins": origins}}})
    transport = httpx.ASGITransport(app=create_app(config))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        answer = await http.options("/threads", headers=_preflight(origin))
    assert answer.headers.get("access-control-allow-origin") == allowed
    assert answer.status_code == (200 if allowed else 400)


@pytest.mark.parametrize("origin", ["http://chat.example.com/", "chat.example.com"])
def test_an_origin_with_a_path_or_without_scheme_is_a_config_error(tmp_path: Path, origin: str) -> None:
    with pytest.raises(ValueError, match="is not an origin"):
        KeelConfig.model_validate({"gateway": {"cors": {"allow_origins": [origin]}}})


async def test_json_sent_as_text_plain_is_accepted(client: Any) -> None:
    """Agent Chat UI's ``/api`` passthrough forwards every body as ``text/plain``."""
    plain = {"Content-Type": "text/plain;charset=UTF-8"}
    thread = await client.http.post("/threads", json={"metadata": {"via": "passthrough"}}, headers=plain)
    assert thread["metadata"] == {"via": "passthrough"}
    final = await client.http.post(
        f"/threads/{thread['thread_id']}/runs/wait", json={"assistant_id": "echo", "input": {"steps": 2}},
        headers=plain,
    )
    assert final["done"] == 2
    found = await client.http.post("/threads/search", json={"metadata": {"via": "passthrough"}}, headers=plain)
    assert [t["thread_id"] for t in found] == [thread["thread_id"]]


@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
async def test_a_body_that_is_not_json_is_a_clear_422(keel_server: KeelServer, content_type: str) -> None:
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        answer = await http.post("/threads", content=b'{"metadata": {', headers={"Content-Type": content_type})
    assert answer.status_code == 422
    body = answer.json()
    assert body["field"] == "body" and body["detail"].startswith("body: invalid JSON (")


async def test_a_run_stamps_its_thread_with_graph_and_assistant(client: Any) -> None:
    tag = uuid.uuid4().hex
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    assert "graph_id" not in (await client.threads.get(tid))["metadata"]
    await client.runs.wait(tid, "echo", input={"steps": 1})
    metadata = (await client.threads.get(tid))["metadata"]
    echo = await client.assistants.get(metadata["assistant_id"])
    assert metadata["graph_id"] == "echo" and echo["graph_id"] == "echo" and metadata["tag"] == tag

    found = await client.threads.search(metadata={"graph_id": "echo", "tag": tag})
    assert [t["thread_id"] for t in found] == [tid]
    # Agent Chat UI searches by assistant_id when its assistant is given as a UUID.
    by_uuid = await client.threads.search(metadata={"assistant_id": echo["assistant_id"], "tag": tag})
    assert [t["thread_id"] for t in by_uuid] == [tid]
    await client.runs.wait(tid, "chat", input={"messages": [{"role": "user", "content": "hi"}]})
    assert (await client.threads.get(tid))["metadata"]["graph_id"] == "chat"  # the latest run's graph
    assert await client.threads.search(metadata={"graph_id": "echo", "tag": tag}) == []


async def test_a_thread_created_by_a_run_is_stamped(client: Any) -> None:
    tid = str(uuid.uuid4())
    await client.runs.wait(tid, "echo", input={"steps": 1}, if_not_exists="create")
    found = await client.threads.search(metadata={"graph_id": "echo"}, ids=[tid])
    assert [t["thread_id"] for t in found] == [tid]


async def test_a_resume_with_an_empty_input_is_accepted(client: Any) -> None:
    """``submit(undefined, {command: {resume}})`` in some UIs sends ``input: {}`` along."""
    tid = (await client.threads.create())["thread_id"]
    asked = await client.runs.wait(tid, "hitl", input={"steps": 1})
    assert asked["__interrupt__"][0]["value"] == {"question": "approve?"}
    final = await client.runs.wait(tid, "hitl", input={}, command={"resume": "yes"})
    assert final["messages"][-1]["content"] == "human said yes" and "__interrupt__" not in final
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_a_resume_with_a_real_input_is_still_refused(client: Any) -> None:
    """Input and command together would drop one of them: refused, naming the field."""
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "hitl", input={"steps": 1})
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await client.runs.wait(tid, "hitl", input={"steps": 2}, command={"resume": "yes"})
    assert caught.value.response.status_code == 422
    assert caught.value.response.json()["field"] == "command"


async def test_strict_resume_answers_only_a_waiting_interrupt(client: Any) -> None:
    """``useStream``'s ``strictResume``: a second tab's resume of an answered interrupt is a 409."""
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "hitl", input={"steps": 1})
    first = await client.http.post(
        f"/threads/{tid}/runs/wait", json={"assistant_id": "hitl", "command": {"resume": "yes"}, "strict_resume": True},
    )
    assert first["messages"][-1]["content"] == "human said yes"
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await client.runs.wait(tid, "hitl", command={"resume": "again"}, strict_resume=True)
    assert caught.value.response.status_code == 409
    assert "no interrupt" in caught.value.response.json()["detail"]
    assert len(await client.runs.list(tid)) == 2  # the refused resume left no run behind
