"""``keel worker``: a process that executes runs and serves no HTTP.

Any number of workers and gateways (``keel serve --no-worker``) share one PostgreSQL database (and
one Redis for the streams): gateways admit runs and store control requests, workers claim the runs,
renew their leases, carry out the requests and recover the runs of workers that were lost.

Signals: the first SIGTERM/SIGINT stops claiming and gives running runs ``gateway.drain_s`` to
finish, then interrupts and finalizes the rest; a second one interrupts at once. Whatever a dead
database or Redis does to finalization, the process is gone ``FORCE_EXIT_S`` after the signal that
asked it to stop: its unfinished runs are then recovered by another worker when their leases expire.

With ``worker.metrics_port`` (or ``--metrics-port``) the worker also serves ``/metrics`` and
``/healthz`` (``worker_http.py``) for as long as it runs, its drain included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import typer

from agentkeel.cli.event_loop import run_async
from agentkeel.cli.worker_http import MetricsServer, bind_metrics_socket, metrics_app
from agentkeel.config import KeelConfig
from agentkeel.harness.agents import Harness
from agentkeel.runtime.runtime import Runtime, open_runtime

# After a stop signal: the drain, then at most this long to finalize before the process exits anyway.
FORCE_EXIT_S = 10.0


def run_worker(config: KeelConfig, harness: Harness) -> int:
    """Execute runs until a signal; 0 after a clean drain, 2 when the metrics port cannot be bound."""
    sock = None
    port = config.worker.metrics_port
    if port is not None:
        host = config.worker.metrics_host
        try:
            sock = bind_metrics_socket(host, port)
        except OSError as exc:
            typer.secho(f"keel worker: cannot serve metrics on {host}:{port}: {exc}", err=True, fg="red")
            return 2
    return run_async(_serve_runs(config, harness, sock))


async def _serve_runs(config: KeelConfig, harness: Harness, metrics_sock: socket.socket | None = None) -> int:
    stop = asyncio.Event()
    opened: list[Runtime] = []
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals == 1:
            arm_force_exit(config.gateway.drain_s + FORCE_EXIT_S)
        else:  # a second signal: interrupt the runs now instead of waiting out the drain
            arm_force_exit(FORCE_EXIT_S)
            for runtime in opened:
                asyncio.ensure_future(runtime.manager.shutdown(0))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    async with open_runtime(config, harness=harness, drain_s=config.gateway.drain_s) as runtime:
        opened.append(runtime)
        server = None
        if metrics_sock is not None:
            app = metrics_app(runtime.metrics, runtime.manager.owner, stop.is_set)
            server = MetricsServer(metrics_sock, app)
            await server.start()
            typer.echo(f"AgentKeel worker metrics on {server.url}/metrics")
        freeze_heap()
        typer.echo(f"AgentKeel worker {runtime.manager.owner} ready ({config.database_url})")
        try:
            await stop.wait()
            await runtime.manager.shutdown(config.gateway.drain_s)
        finally:
            if server is not None:
                await server.stop()
    return 0


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``); called by
    ``keel serve`` and ``keel worker`` once they are ready to take runs.

    Why: a process that is ready holds a few hundred thousand long-lived objects (LangChain,
    LangGraph, pydantic and SQLAlchemy modules, the compiled config), and every full collection
    walks all of them: about 100 ms during which the one event loop serves nobody. Such a pause
    fell into ten runs starting together and delayed the later ones by that much. Frozen, those
    objects are still freed by reference counting; only cycles among them would never be
    collected, and what exists at start-up lives as long as the process anyway.
    """
    import gc

    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()


def arm_force_exit(after_s: float) -> None:
    """Exit the process ``after_s`` from now unless it has exited by then (a hung finalization
    must not keep a stopped worker alive); the timer is a daemon thread, immune to a blocked loop."""
    import threading

    timer = threading.Timer(after_s, lambda: os._exit(1))
    timer.daemon = True
    timer.start()
