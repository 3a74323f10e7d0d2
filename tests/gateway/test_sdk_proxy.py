"""The SDK heals a connection cut mid-response, through ``Location`` and ``Last-Event-ID``.

A tiny TCP proxy sits between the SDK and the server and, on the first request whose request line
contains a trigger, closes the client's connection after a number of response-body bytes — what a
load balancer's idle timeout or a server restart looks like to a client. The test then checks
that the SDK reconnected where the server told it to, with the last id it saw, and delivered
every event exactly once (compared with a full replay read directly from the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Self

import pytest
from server_support import KeelServer, collect, sdk

HEAD_END = b"\r\n\r\n"


@dataclass
class _Exchange:
    """One client connection: whether it is to be cut, and how much of the response passed."""

    armed: bool = False
    head: bytes = b""
    body_bytes: int = -1  # -1 while the response head is still arriving


@dataclass
class CuttingProxy:
    upstream_port: int
    trigger: bytes
    cut_after: int  # response-body bytes let through before the cut
    cuts_left: int = 1
    cuts: int = 0
    requests: list[str] = field(default_factory=list)  # request heads seen, in order
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        exchange = _Exchange()
        pumps = {
            asyncio.create_task(self._upstream(client_r, server_w, exchange)),
            asyncio.create_task(self._downstream(server_r, client_w, exchange)),
        }
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for writer in (client_w, server_w):
                writer.close()

    async def _upstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exchange: _Exchange) -> None:
        while data := await reader.read(65536):
            request_line = data.split(b"\r\n", 1)[0]
            if request_line.split(b" ", 1)[0] in (b"GET", b"POST", b"PUT", b"PATCH", b"DELETE"):
                self.requests.append(data.split(HEAD_END, 1)[0].decode(errors="replace"))
                if self.cuts_left and self.trigger in request_line:
                    self.cuts_left -= 1
                    exchange.armed, exchange.head, exchange.body_bytes = True, b"", -1
            writer.write(data)
            await writer.drain()

    async def _downstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exchange: _Exchange) -> None:
        while data := await reader.read(65536):
            if exchange.armed:
                cut_at = self._cut_position(exchange, data)
                if cut_at is not None:
                    writer.write(data[:cut_at])
                    await writer.drain()
                    self.cuts += 1
                    writer.transport.abort()  # the client sees its connection drop mid-body
                    return
            writer.write(data)
            await writer.drain()

    def _cut_position(self, exchange: _Exchange, data: bytes) -> int | None:
        """Where in ``data`` the allowance of body bytes runs out (None: not in this chunk)."""
        offset = 0
        if exchange.body_bytes < 0:
            exchange.head += data
            end = exchange.head.find(HEAD_END)
            if end < 0:
                return None
            offset = len(data) - (len(exchange.head) - end - len(HEAD_END))
            exchange.body_bytes = 0
        remaining = self.cut_after - exchange.body_bytes
        if len(data) - offset >= remaining:
            return offset + remaining
        exchange.body_bytes += len(data) - offset
        return None


@contextlib.asynccontextmanager
async def _through_proxy(server: KeelServer, trigger: bytes, cut_after: int) -> AsyncIterator[tuple[CuttingProxy, Any]]:
    async with CuttingProxy(server.port, trigger, cut_after) as proxy, sdk(proxy.url) as client:
        yield proxy, client


def _heads(proxy: CuttingProxy, start: str) -> list[str]:
    return [r for r in proxy.requests if r.startswith(start)]


def _last_event_id(head: str) -> str | None:
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "last-event-id":
            return value.strip()
    return None


async def test_stream_heals_through_location_and_last_event_id(keel_server: KeelServer) -> None:
    async with _through_proxy(keel_server, b"/runs/stream", cut_after=1500) as (proxy, client):
        tid = (await client.threads.create())["thread_id"]
        parts = await collect(
            client.runs.stream(tid, "echo", input={"steps": 12, "custom": 3, "delay": 0.05},
                               stream_mode=["updates", "custom"]),
            timeout=40,
        )
    assert proxy.cuts == 1
    run_id = parts[0].data["run_id"]
    (reconnect,) = _heads(proxy, f"GET /threads/{tid}/runs/{run_id}/stream ")
    resumed_after = _last_event_id(reconnect)
    assert resumed_after is not None
    ids = [p.id for p in parts]
    assert resumed_after in ids[:-1]  # the cut came mid-stream, after some events and before others

    async with sdk(keel_server.url) as direct:
        full = await collect(direct.runs.join_stream(tid, run_id, last_event_id="-1"))
    assert len(set(ids)) == len(ids)  # nothing twice
    assert parts == full  # nothing missing, same order, same data
    assert [p.event for p in parts].count("custom") == 36 and [p.event for p in parts].count("updates") == 12


@pytest.mark.filterwarnings("ignore:Request failed, attempting reconnect")
async def test_wait_heals_through_location(keel_server: KeelServer) -> None:
    async with _through_proxy(keel_server, b"/runs/wait", cut_after=1) as (proxy, client):
        tid = (await client.threads.create())["thread_id"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = await asyncio.wait_for(
                client.runs.wait(tid, "echo", input={"steps": 10, "delay": 0.1}), 40
            )
    assert proxy.cuts == 1
    assert result["done"] == 10
    joins = [r for r in proxy.requests if r.startswith(f"GET /threads/{tid}/runs/") and "/join " in r.split("\r\n")[0]]
    assert len(joins) == 1
