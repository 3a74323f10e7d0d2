"""Liveness, readiness, server info and Prometheus metrics.

``/healthz`` answers as long as the process serves HTTP; ``/readyz`` also proves that the run
store and the stream bridge answer (and turns 503 while the gateway drains, so a load balancer
stops sending work before runs are interrupted). ``/metrics`` is the Prometheus exposition of
``gateway.metrics``: what this process saw since it started, and the store's live runs by status;
durable totals are in the store (``GET /threads/{id}/runs``, ``keel runs list``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

import agentkeel
from agentkeel.gateway.deps import Gateway, gateway
from agentkeel.gateway.metrics import CONTENT_TYPE

router = APIRouter(tags=["meta"])
GW = Annotated[Gateway, Depends(gateway)]
READY_TIMEOUT_S = 2.0
_PROBE_ID = "agentkeel-readyz-probe"


@router.get("/ok")  # the LangGraph server's name
@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"ok": True}


@router.get("/info")
async def info() -> dict[str, Any]:
    return {
        "version": agentkeel.__version__,
        "server": "agentkeel",
        "flags": {"assistants": True, "crons": False, "langsmith": False},
        "host": {"kind": "agentkeel"},
    }


class Readiness(BaseModel):
    """``/readyz``'s body, 200 or 503 alike: a probe reads why it is not ready."""

    ok: bool
    store: str  # "ok", or why the run store did not answer
    stream: str
    draining: bool


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "Not ready"}})
async def readyz(gw: GW) -> JSONResponse:
    checks = {
        "store": _probe(gw.runtime.store.get_thread(_PROBE_ID)),
        "stream": _probe(gw.runtime.bridge.exists(_PROBE_ID)),
    }
    results = dict(zip(checks, await asyncio.gather(*checks.values()), strict=True))
    ready = not gw.draining and all(r == "ok" for r in results.values())
    body = {"ok": ready, **results, "draining": gw.draining}
    return JSONResponse(body, status_code=200 if ready else 503)


async def _probe(check: Any) -> str:
    try:
        await asyncio.wait_for(check, READY_TIMEOUT_S)
    except TimeoutError:
        return f"timed out after {READY_TIMEOUT_S:g} s"
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


@router.get("/metrics", response_class=Response)
async def metrics(gw: GW) -> Response:
    return Response(await gw.metrics.exposition(), media_type=CONTENT_TYPE)
