"""Input limits against a real ``keel serve`` process: each bad input found by hand on the unbounded
gateway answers 4xx naming the field, with nothing stored, and never costs the client its
keep-alive connection.

Raw ``httpx`` rather than the SDK: these requests are ones no SDK would send (oversized, NUL
bytes, 2^63), and the tests look at the connection itself (its local port) across requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st
from server_support import KeelServer, free_port, wait_until

from agentkeel.config import GatewayConfig, KeelConfig
from agentkeel.gateway.app import create_app
from agentkeel.gateway.errors import ErrorBody
from agentkeel.gateway.input_limits import InputRefused, check_json

BIG = 2**63
MiB = 1024 * 1024


@pytest.fixture
async def http(keel_server: KeelServer) -> AsyncIterator[httpx.AsyncClient]:
    """One connection at most, so "the same connection" is a property the tests can check."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=keel_server.url, limits=limits, timeout=60) as client:
        yield client


def local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried ``response``."""
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


async def thread_count(http: httpx.AsyncClient) -> int:
    response = await http.post("/threads/count", json={})
    assert response.status_code == 200
    return int(response.json())


async def new_thread(http: httpx.AsyncClient) -> str:
    response = await http.post("/threads", json={})
    assert response.status_code == 200
    return str(response.json()["thread_id"])


async def runs_of(http: httpx.AsyncClient, thread_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/threads/{thread_id}/runs")
    assert response.status_code == 200, response.text
    return list(response.json())


def refused(response: httpx.Response, status: int, field: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field, body
    assert body["detail"].startswith(f"{field}:") or field in body["detail"], body


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def echo_run(**extra: Any) -> dict[str, Any]:
    return {"assistant_id": "echo", "input": {"steps": 1}, **extra}


async def test_integers_beyond_64_bits_are_refused(http: httpx.AsyncClient) -> None:
    thread_id = await new_thread(http)
    refused(await http.get(f"/threads/{thread_id}/runs", params={"offset": BIG}), 422, "offset")
    refused(await http.get(f"/threads/{thread_id}/runs", params={"limit": BIG}), 422, "limit")
    refused(await http.get(f"/threads/{thread_id}/runs/{uuid.uuid4()}/journal", params={"after_seq": BIG}),
            422, "after_seq")
    refused(await http.post("/threads/search", json={"limit": BIG}), 422, "limit")
    refused(await http.post("/threads/search", json={"offset": BIG}), 422, "offset")
    refused(await http.post("/threads/search", json={"limit": 10**6 + 1}), 422, "limit")
    refused(await http.post(f"/threads/{thread_id}/runs", json=echo_run(metadata={"n": -BIG - 1})), 422, "metadata.n")
    assert await runs_of(http, thread_id) == []


async def test_nul_characters_are_refused_wherever_they_are(http: httpx.AsyncClient) -> None:
    before = await thread_count(http)
    refused(await http.post("/threads", json={"metadata": {"k": "a\x00b"}}), 422, "metadata.k")
    refused(await http.post("/threads", json={"metadata": {"a\x00": 1}}), 422, "metadata.a\x00")
    refused(await http.post("/threads", json={"thread_id": "t\x00"}), 422, "thread_id")
    refused(await http.post("/runs/wait", json=echo_run(input={"messages": [{"role": "user", "content": "hi\x00"}]})),
            422, "input.messages[0].content")
    refused(await http.post("/runs/wait", json=echo_run(config={"configurable": {"x": "\x00"}})),
            422, "config.configurable.x")
    refused(await http.get("/threads/abc%00def"), 422, "thread_id")
    refused(await http.post("/threads/search", params={"q": "a\x00"}, json={}), 422, "q")
    assert await thread_count(http) == before


async def test_ids_in_the_path_must_have_an_id_shape(http: httpx.AsyncClient) -> None:
    refused(await http.get("/threads/not an id"), 422, "thread_id")
    refused(await http.get(f"/threads/{'x' * 129}"), 422, "thread_id")
    refused(await http.get(f"/threads/{uuid.uuid4()}/runs/..%2Fetc"), 422, "run_id")
    refused(await http.get("/assistants/%C3%A9t%C3%A9"), 422, "assistant_id")
    assert (await http.get(f"/threads/{uuid.uuid4()}")).status_code == 404  # a well-shaped id: looked up
    refused(await http.post("/runs/cancel", json={"run_ids": ["../x"]}), 422, "run_ids.0")
    refused(await http.post("/runs/cancel", json={"thread_id": "a b"}), 422, "thread_id")
    refused(await http.post("/threads/search", json={"ids": ["x" * 129]}), 422, "ids.0")


async def test_deep_metadata_is_refused_before_the_run_or_its_thread_exists(http: httpx.AsyncClient) -> None:
    """Nested 900 deep, this metadata used to be admitted, run, then fail with a 500 (so a retry ran
    it twice) and leave the thread's run list failing for good."""
    thread_id = await new_thread(http)
    response = await http.post(f"/threads/{thread_id}/runs/wait", json=echo_run(metadata=nested(900)))
    refused(response, 422, "metadata" + ".a" * 31)
    assert "deeper than 32" in response.json()["detail"]
    assert await runs_of(http, thread_id) == []  # the thread's run list keeps working

    fresh = str(uuid.uuid4())
    created = echo_run(metadata=nested(900), if_not_exists="create")
    assert (await http.post(f"/threads/{fresh}/runs", json=created)).status_code == 422
    assert (await http.get(f"/threads/{fresh}")).status_code == 404  # the thread was never created

    before = await thread_count(http)
    deeper = b'{"assistant_id": "echo", "metadata": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001
    refused(await http.post("/runs/wait", content=deeper), 422, "body")  # past the parser's own limit
    assert await thread_count(http) == before

    ok = await http.post(f"/threads/{thread_id}/runs/wait", json=echo_run(metadata=nested(30)))
    assert ok.status_code == 200, ok.text
    assert len(await runs_of(http, thread_id)) == 1


async def test_after_seconds_is_bounded_and_finite(http: httpx.AsyncClient) -> None:
    thread_id = await new_thread(http)
    refused(await http.post(f"/threads/{thread_id}/runs", json=echo_run(after_seconds=1e300)), 422, "after_seconds")
    refused(await http.post(f"/threads/{thread_id}/runs", json=echo_run(after_seconds=7 * 86400 + 1)),
            422, "after_seconds")
    infinite = b'{"assistant_id": "echo", "after_seconds": 1e400}'
    refused(await http.post(f"/threads/{thread_id}/runs", content=infinite), 422, "after_seconds")
    nan = b'{"assistant_id": "echo", "after_seconds": NaN}'
    refused(await http.post(f"/threads/{thread_id}/runs", content=nan), 422, "body")
    assert await runs_of(http, thread_id) == []


async def test_message_count_and_metadata_size_are_bounded(http: httpx.AsyncClient) -> None:
    thread_id = await new_thread(http)
    many = {"messages": [{"role": "user", "content": "hi"}] * 1001}
    refused(await http.post(f"/threads/{thread_id}/runs", json=echo_run(input=many)), 422, "input.messages")
    big = {"blob": "x" * (64 * 1024)}
    refused(await http.post(f"/threads/{thread_id}/runs", json=echo_run(metadata=big)), 422, "metadata")
    refused(await http.post("/threads", json={"metadata": big}), 422, "metadata")
    assert await runs_of(http, thread_id) == []


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_oversized_bodies_are_refused_without_buffering(http: httpx.AsyncClient, keel_server: KeelServer) -> None:
    before_threads = await thread_count(http)
    body = b'{"metadata": {"blob": "' + b"x" * (10 * MiB) + b'"}}'
    response = await http.post("/threads", content=body)  # declared: refused before reading
    refused(response, 413, "body")
    assert "2097152 bytes (gateway.max_body_bytes)" in response.json()["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # undeclared (chunked): refused while reading
        yield b'{"metadata": {"blob": "'
        for _ in range(100):
            yield b"x" * MiB
        yield b'"}}'

    rss_before = vm_rss_kib(keel_server.pid)
    refused(await http.post("/threads", content=chunks()), 413, "body")
    grown_mib = (vm_rss_kib(keel_server.pid) - rss_before) / 1024
    assert grown_mib < 8, f"the server's RSS grew by {grown_mib:.1f} MiB for a refused 100 MB body"
    assert await thread_count(http) == before_threads


async def test_refusals_keep_the_connection(http: httpx.AsyncClient) -> None:
    """Every kind of refusal, each from a different layer, on one HTTP/1.1 connection: each is an
    ``ErrorBody`` (what OpenAPI publishes for every 4xx/5xx) and none closes the connection."""
    first = await http.get("/ok")
    port = local_port(first)
    thread_id = await new_thread(http)
    answers = [
        await http.post("/threads", content=b"{" + b" " * (3 * MiB) + b"}"),  # 413
        await http.post("/threads", json={"metadata": {"k": "\x00"}}),  # 422 from the limits
        await http.post("/threads", json={"if_exists": "sometimes"}),  # 422 from the route's model
        await http.post("/threads", content=b'{"metadata": '),  # 422: not JSON
        await http.get(f"/threads/{uuid.uuid4()}"),  # 404
        await http.post("/threads", json={"thread_id": thread_id}),  # 409: exists
        await http.get("/ok", headers={"Host": "evil.example"}),  # 400 from the Host check
        await http.put("/threads/search", json={}),  # 405 from the router
    ]
    assert [a.status_code for a in answers] == [413, 422, 422, 422, 404, 409, 400, 405]
    for answer in answers:
        body = ErrorBody.model_validate(answer.json())
        assert body.detail, answer.text
    last = await http.post("/threads", json={})
    assert last.status_code == 200
    assert {local_port(a) for a in [first, *answers, last]} == {port}


@contextlib.contextmanager
def served_with_a_failing_route(tmp_path: Path) -> Iterator[str]:
    """The real app under a real uvicorn (in a thread), plus one route that fails unexpectedly:
    nothing in the served API is known to 500, so a 500 has to be forced this way."""
    app = create_app(KeelConfig(data_dir=str(tmp_path / "data"), base_dir=tmp_path))

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("an unexpected failure")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def test_an_unexpected_500_is_json_and_keeps_the_connection(tmp_path: Path) -> None:
    with served_with_a_failing_route(tmp_path) as url:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:

            async def up() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/ok")).status_code == 200
                return False

            await wait_until(up, timeout=30)
            first = await http.get("/ok")
            failed = await http.get("/boom")
            assert failed.status_code == 500
            assert failed.json() == {"detail": "internal error"}
            after = await http.get("/ok")
            assert after.status_code == 200
            assert local_port(first) == local_port(failed) == local_port(after)
            await asyncio.sleep(0)


async def test_nul_characters_are_refused_on_postgresql(keel_server_pg: KeelServer) -> None:
    """PostgreSQL cannot store NUL in text or jsonb: this was a 500 after the request got through."""
    async with httpx.AsyncClient(base_url=keel_server_pg.url, timeout=60) as http:
        before = await thread_count(http)
        refused(await http.post("/threads", json={"metadata": {"k": "a\x00b"}}), 422, "metadata.k")
        thread_id = await new_thread(http)
        message = {"messages": [{"role": "user", "content": "\x00"}]}
        refused(await http.post(f"/threads/{thread_id}/runs", json=echo_run(input=message)),
                422, "input.messages[0].content")
        refused(await http.post("/threads/search", json={"metadata": {"k": "\x00"}}), 422, "metadata.k")
        assert await thread_count(http) == before + 1
        assert await runs_of(http, thread_id) == []


CLEAN_TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8)
SHALLOW_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-BIG, BIG - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | CLEAN_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(CLEAN_TEXT, children, max_size=4),
    max_leaves=20,
)


@given(SHALLOW_JSON, st.integers(0, 8))
def test_a_nul_anywhere_is_found_and_named(value: Any, depth: int) -> None:
    """Whatever the body, the walk admits it as it is and refuses it with a NUL planted at any
    depth, naming the path to it."""
    config = GatewayConfig()
    check_json({"metadata": {"v": value}}, config)
    planted: Any = "x\x00"
    for _ in range(depth):
        planted = [{"k": planted}]
    with pytest.raises(InputRefused) as refusal:
        check_json({"v": value, "w": planted}, config)
    assert (refusal.value.status, refusal.value.field) == (422, "w" + "[0].k" * depth)
