"""``keel worker``'s own small HTTP endpoint: ``GET /metrics`` (Prometheus text) and ``/healthz``.

The worker executes runs, so its run series (``runtime/metrics.py``: runs finished, tokens, guard
interventions, lease recoveries, runs active) exist only in its process; this is where Prometheus
reads them. Off unless a port is given (``worker.metrics_port`` or ``--metrics-port``); loopback by
default, with no authentication, like most exporters — bind another address only where the network
in front decides who may scrape.

Why Starlette under uvicorn on the worker's own event loop: both already serve the gateway (no new
dependency), the counters are read on the loop that moves them, and stopping is one flag —
``prometheus_client.start_http_server`` would answer from a thread and has no ``/healthz``.
uvicorn's signal handling is turned off, so the worker's own handlers (drain, then force exit) stay
in charge. The socket is bound before the runtime opens: a port in use is a CLI error before any
run is claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentkeel.runtime.metrics import CONTENT_TYPE, RunMetrics

STOP_WAIT_S = 5.0  # how long stopping waits for uvicorn to close its connections


def bind_metrics_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port); raises ``OSError`` (in use, no such
    address) for the caller to report."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def metrics_app(metrics: RunMetrics, owner: str, draining: Callable[[], bool]) -> Starlette:
    async def exposition(_request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def healthz(_request: Request) -> JSONResponse:
        # Liveness only: a draining worker is still alive (and still finishing its runs).
        return JSONResponse({"ok": True, "owner": owner, "draining": draining()})

    return Starlette(routes=[Route("/metrics", exposition), Route("/healthz", healthz)])


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the worker handles SIGTERM/SIGINT itself


class MetricsServer:
    """The endpoint on an already bound socket, served on the running loop until :meth:`stop`."""

    def __init__(self, sock: socket.socket, app: Starlette) -> None:
        self._sock = sock
        self._server = _QuietServer(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="agentkeel-worker-metrics")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the metrics endpoint stopped before it started")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, STOP_WAIT_S)
        self._sock.close()
