"""Composing the gateway: the FastAPI app, its routers, error handlers and runtime lifetime.

``create_app(config)`` owns the runtime: the lifespan opens it and, at shutdown, drains it (stop
admitting, bounded wait, interrupt and finalize the rest) before closing it. ``create_app(runtime)``
serves a runtime someone else opened and closes (tests, embedding); it is usable at once, without
running the lifespan.

Browser clients: the ``Host`` check (``hosts``) wraps everything, so a DNS-rebinding page is
refused before CORS or any route sees its request. Inside it CORS (``cors``) wraps the rest, so a
4xx answer is readable cross-origin too; request bodies are JSON whatever their content type
(``json_bodies``) and bounded in size, depth and content before any route runs
(``input_limits``, which also publishes the id shape of path segments in OpenAPI), and an unexpected failure is a JSON 500 that keeps the connection open
(``errors.InternalErrors``, innermost, so CORS headers reach it too).

The threads, assistants and store routers come from modules written alongside this one; each is
included when its module exists, so the app composes whatever resources are installed.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from fastapi import FastAPI

import agentkeel
from agentkeel.config import KeelConfig
from agentkeel.gateway.auth import install_auth
from agentkeel.gateway.console import api as console_api
from agentkeel.gateway.console import pages as console_pages
from agentkeel.gateway.cors import install_cors
from agentkeel.gateway.deps import Gateway
from agentkeel.gateway.errors import ERROR_RESPONSES, InternalErrors, install_error_handlers, publish_error_body
from agentkeel.gateway.hosts import HostCheck, allowed_names
from agentkeel.gateway.input_limits import InputLimits, publish_segment_shape
from agentkeel.gateway.json_bodies import JsonBodies
from agentkeel.gateway.metrics import Metrics
from agentkeel.gateway.requests_first import RequestsFirst
from agentkeel.gateway.routes import meta, runs
from agentkeel.gateway.startup_failures import StartupFailures
from agentkeel.harness.agents import Harness
from agentkeel.runtime.runtime import Runtime, open_runtime

OPTIONAL_ROUTERS = ("threads", "assistants", "store", "timeline")


def create_app(
    source: KeelConfig | Runtime, *, harness: Harness | None = None, worker: bool = True,
    bound_host: str | None = None,
) -> FastAPI:
    """The gateway over a running ``Runtime``, or over one it opens from a config (with an
    already built ``harness``, so start-up does not import graphs and load scripts twice).
    ``worker=False``: this process serves HTTP only; ``keel worker`` processes execute the runs.
    ``bound_host``: the address the server listens on, allowed in ``Host`` besides the loopback
    names unless ``gateway.allowed_hosts`` says otherwise."""
    metrics = Metrics()
    given = Gateway(source, source.config.gateway, metrics) if isinstance(source, Runtime) else None
    config = source.config if isinstance(source, Runtime) else source

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if given is not None:
            yield
            await given.settle()
            return
        async with open_runtime(
            config, harness=harness,
            drain_s=config.gateway.drain_s, executes="all" if worker else "none",
        ) as runtime:
            gw = app.state.gateway = Gateway(runtime, config.gateway, metrics)
            try:
                yield
            finally:
                await gw.drain()

    app = FastAPI(title="AgentKeel", version=agentkeel.__version__, lifespan=lifespan, responses=ERROR_RESPONSES)
    if given is not None:
        app.state.gateway = given
    install_error_handlers(app)
    app.add_middleware(InternalErrors)
    app.add_middleware(JsonBodies)
    app.add_middleware(InputLimits, config=config.gateway)
    install_auth(app, config)  # inside CORS (a preflight has no credentials), before any body is read
    install_cors(app, config.gateway.cors)  # outside the rest, so refusals get CORS headers too
    app.add_middleware(HostCheck, allowed=allowed_names(config.gateway.allowed_hosts, bound_host))
    app.add_middleware(RequestsFirst)  # outermost: a request holds the start gate from its first byte
    app.add_middleware(StartupFailures)  # lifespan only: a runtime that cannot open, in one line
    app.include_router(meta.router)
    app.include_router(runs.router)
    for module in _installed_routers():
        app.include_router(module.router)
    app.include_router(console_pages.router)
    app.include_router(console_api.router)

    def openapi() -> dict[str, Any]:
        return publish_error_body(publish_segment_shape(FastAPI.openapi(app)))  # FastAPI builds it once, caches it

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _installed_routers() -> list[ModuleType]:
    found = []
    for name in OPTIONAL_ROUTERS:
        qualified = f"agentkeel.gateway.routes.{name}"
        try:
            found.append(importlib.import_module(qualified))
        except ModuleNotFoundError as exc:
            if exc.name != qualified:
                raise  # the module exists but one of its imports is missing: a real error
    return found
