"""The ``Host`` allowlist against a real ``keel serve`` process: what a DNS-rebinding page sends
(its own name in ``Host``, on a connection to 127.0.0.1) is refused with 400 naming ``Host``
before anything is stored or CORS answers, and the connection stays usable.

Raw ``httpx`` with an explicit ``Host`` header: that is exactly what differs between a local
client and a rebinding page, whose requests reach the same address and port.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from pydantic import ValidationError
from server_support import KeelServer, start_server, write_project

from agentkeel.config import GatewayConfig
from agentkeel.gateway.hosts import allowed_names, host_name

EVIL = "evil.example"


def local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried ``response``."""
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


@pytest.fixture
async def http(keel_server: KeelServer) -> AsyncIterator[httpx.AsyncClient]:
    """One connection at most, so "the same connection" is a property the tests can check."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=keel_server.url, limits=limits, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    """A server that allows any name (``allowed_hosts: ["*"]``)."""
    server = start_server(write_project(tmp_path_factory.mktemp("keel-any-host"), gateway={"allowed_hosts": ["*"]}))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bound_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    """The default allowlist on a server bound to 127.0.0.2 (not one of the loopback names)."""
    server = start_server(write_project(tmp_path_factory.mktemp("keel-bound-host")), host="127.0.0.2")
    yield server
    server.stop()


def refused_host(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["field"] == "Host", body
    assert body["detail"].startswith("Host:") and "gateway.allowed_hosts" in body["detail"], body


async def thread_count(http: httpx.AsyncClient) -> int:
    response = await http.post("/threads/count", json={})
    assert response.status_code == 200, response.text
    return int(response.json())


async def test_loopback_names_answer_with_or_without_a_port(http: httpx.AsyncClient, keel_server: KeelServer) -> None:
    port = keel_server.port
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", "[::1]", f"[::1]:{port}",
                 "127.0.0.1:1"):  # the port is not compared
        response = await http.get("/ok", headers={"Host": host})
        assert response.status_code == 200, (host, response.text)


async def test_a_foreign_host_is_refused_and_stores_nothing(http: httpx.AsyncClient, keel_server: KeelServer) -> None:
    before = await thread_count(http)
    port = keel_server.port
    for host in (EVIL, f"{EVIL}:{port}", f"localhost.{EVIL}", "127.0.0.1.nip.io", "[::2]", "localhost:x"):
        refused_host(await http.post("/threads", json={}, headers={"Host": host}))
    refused_host(await http.post("/threads/count", json={}, headers={"Host": EVIL}))
    refused_host(await http.get("/ok", headers={"Host": EVIL}))
    assert await thread_count(http) == before


async def test_a_preflight_from_a_rebinding_page_is_refused(http: httpx.AsyncClient, keel_server: KeelServer) -> None:
    """The origin is one CORS allows, so only the ``Host`` check can refuse it."""
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    allowed = await http.options("/threads", headers=preflight)
    assert allowed.status_code == 200, allowed.text
    refused = await http.options("/threads", headers={**preflight, "Host": f"{EVIL}:{keel_server.port}"})
    refused_host(refused)
    assert "access-control-allow-origin" not in refused.headers


async def test_the_connection_survives_a_refused_host(http: httpx.AsyncClient) -> None:
    first = await http.get("/ok")
    refused = await http.post("/threads", json={"metadata": {"k": "v" * 10_000}}, headers={"Host": EVIL})
    refused_host(refused)
    after = await http.post("/threads/count", json={})
    assert after.status_code == 200
    assert local_port(first) == local_port(refused) == local_port(after)


async def test_star_allows_any_host(open_server: KeelServer) -> None:
    async with httpx.AsyncClient(base_url=open_server.url, timeout=30) as http:
        for host in (EVIL, f"{EVIL}:80", "10.1.2.3", "localhost"):
            response = await http.post("/threads", json={}, headers={"Host": host})
            assert response.status_code == 200, (host, response.text)


async def test_the_bound_address_is_allowed_besides_the_loopback_names(bound_server: KeelServer) -> None:
    async with httpx.AsyncClient(base_url=bound_server.url, timeout=30) as http:
        assert (await http.get("/ok")).status_code == 200  # Host: 127.0.0.2:<port>
        assert (await http.get("/ok", headers={"Host": "localhost"})).status_code == 200
        refused_host(await http.get("/ok", headers={"Host": EVIL}))


@pytest.mark.parametrize(("value", "name"), [
    ("Example.COM", "example.com"), ("example.com:8080", "example.com"), ("[::1]", "::1"),
    ("[::1]:2024", "::1"), ("::1", "::1"), ("[::1]x", None), ("[::1", None), ("host:", None),
    ("host:80:81", "host:80:81"), ("", None), (":80", None), ("[]:80", None),
])
def test_host_values_are_parsed_to_their_name(value: str, name: str | None) -> None:
    assert host_name(value) == name


def test_the_allowlist_defaults_to_loopback_and_the_bound_address() -> None:
    assert allowed_names(None, None) == {"localhost", "127.0.0.1", "::1"}
    assert allowed_names(None, "[2001:DB8::1]") == {"localhost", "127.0.0.1", "::1", "2001:db8::1"}
    assert allowed_names(["API.example.com", "[::1]"], "10.0.0.5") == {"api.example.com", "::1"}
    assert allowed_names(["*"], None) is None


@pytest.mark.parametrize("bad", ["example.com:8080", "http://example.com", "example.com/", "", " x"])
def test_allowed_hosts_must_be_bare_names(bad: str) -> None:
    with pytest.raises(ValidationError, match="allowed_hosts"):
        GatewayConfig(allowed_hosts=[bad])
    GatewayConfig(allowed_hosts=["example.com", "::1", "[::1]", "*"])
