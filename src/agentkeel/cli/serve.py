"""``keel serve``: the gateway under uvicorn, with an honest shutdown.

Why not uvicorn's own signal handling: on SIGTERM uvicorn first waits for open connections to
finish and only then runs the app's shutdown. A client following a long run keeps its connection
open until the run ends, so the runs would only be stopped when uvicorn's timeout cut the
connections — the clients would see a dropped stream instead of the run's END. Here the first
SIGTERM/SIGINT drains the runtime *while* serving: new runs are refused (503), running ones get
``gateway.drain_s`` to finish, the rest are interrupted and finalized (status, stop reason, END);
their streams and waits then end normally, and only then does uvicorn stop. A second signal cuts
the drain short (runs are interrupted at once). The process exits 0 (uvicorn would re-raise the
signal after serving) — or, if finalization hangs on an unreachable database, 1 at most
``FORCE_EXIT_S`` after the drain (or after a second signal): runs left unfinished are recovered by
another worker when their leases expire.
"""

from __future__ import annotations

import asyncio
import socket
from types import FrameType

import typer
import uvicorn
from fastapi import FastAPI
from sse_starlette.sse import AppStatus

from agentkeel.cli.event_loop import UVICORN_HTTP, UVICORN_LOOP
from agentkeel.cli.worker import FORCE_EXIT_S, arm_force_exit, freeze_heap
from agentkeel.config import KeelConfig
from agentkeel.gateway.app import create_app
from agentkeel.gateway.auth import AuthSetupError
from agentkeel.gateway.deps import Gateway
from agentkeel.harness.agents import Harness

# Bounds uvicorn's wait for connections once the runtime is drained (every run has ended by then;
# only streams of runs owned by other processes can still be open).
CONNECTIONS_GRACE_S = 5


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, *, force_exit: bool = False) -> None:
        """``force_exit``: this server is the process (``keel serve``), so a stop signal also arms
        the hard exit and the start-up heap is frozen (``freeze_heap``); a server embedded in
        another program (a test) never ends its host nor touches its garbage collector."""
        super().__init__(config)
        self._app = app
        self._force_exit = force_exit
        self._loop: asyncio.AbstractEventLoop | None = None  # set once serving
        self._drains: list[asyncio.Task[None]] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._loop = asyncio.get_running_loop()
            if self._force_exit:
                freeze_heap()
            typer.echo(f"AgentKeel gateway listening on {self.url}")

    @property
    def url(self) -> str:
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None:
            self.should_exit = True  # not serving yet: the lifespan's shutdown drains
            return
        self._loop.call_soon_threadsafe(self._on_signal)

    def _on_signal(self) -> None:
        gateway: Gateway = self._app.state.gateway
        if not self._drains:
            self._arm(gateway.settings.drain_s + CONNECTIONS_GRACE_S + FORCE_EXIT_S)
            self._drains.append(asyncio.ensure_future(self._drain_then_exit(gateway)))
        else:  # a second signal: interrupt the runs now instead of waiting out drain_s
            self._arm(FORCE_EXIT_S)
            self._drains.append(asyncio.ensure_future(gateway.drain(0)))

    def _arm(self, after_s: float) -> None:
        if self._force_exit:
            arm_force_exit(after_s)

    async def _drain_then_exit(self, gateway: Gateway) -> None:
        try:
            await gateway.drain()
        finally:
            self.should_exit = True


def serve_gateway(
    config: KeelConfig, harness: Harness, host: str, port: int, log_level: str = "warning",
    *, worker: bool = True,
) -> int:
    """Serve until a signal; 0 after a clean drain; 2 when ``auth:`` cannot be put to work or the
    runtime cannot open (its database, its data directory); uvicorn's 3 when start-up failed
    otherwise."""
    # Streams end by themselves once their runs end; sse-starlette must not cut them at SIGTERM.
    AppStatus.disable_automatic_graceful_drain()
    try:
        app = create_app(config, harness=harness, worker=worker, bound_host=host)
    except AuthSetupError as exc:  # a key variable unset, auth.path not an Auth: said before serving
        typer.secho(str(exc), err=True, fg="red")
        return 2
    server = GatewayServer(
        uvicorn.Config(
            app, host=host, port=port, lifespan="on", log_level=log_level,
            timeout_graceful_shutdown=CONNECTIONS_GRACE_S, loop=UVICORN_LOOP, http=UVICORN_HTTP,
        ),
        app,
        force_exit=True,
    )
    try:
        server.run()
    except SystemExit:  # uvicorn's start-up failure (3)
        if getattr(app.state, "startup_error", None) is not None:
            return 2  # the runtime could not open; the gateway said why (startup_failures.py)
        raise
    return 0 if server.started else 1
