"""Browser access: which origins may call the gateway, and which response headers they may read.

A chat UI served from its own origin (``http://localhost:3000`` talking to ``:2024``) is a
cross-origin client: the browser sends an ``OPTIONS`` preflight before every JSON ``POST`` and hides
every response header that is not listed as exposed. Without this, the request never leaves the
browser, and the SDK cannot read the run id (``Content-Location``) or its reconnect target
(``Location``).

Default: any loopback origin, any port. Authentication is off by default (``auth.mode: none``), so
allowing every origin by default would let any web page the user visits start runs on a local agent; ``["*"]``
is one config line away for those who want it (``gateway.cors.allow_origins``).
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from agentkeel.config import CorsConfig

LOOPBACK_ORIGINS = r"^https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d{1,5})?$"
# Every response header an official SDK reads, plus what tells a browser client to retry.
EXPOSED_HEADERS = ["Content-Location", "Location", "X-Pagination-Total", "X-Pagination-Next", "Retry-After"]


def install_cors(app: FastAPI, settings: CorsConfig) -> None:
    """Answer preflights (200 with the allowed methods and headers, 400 for a refused origin) and
    stamp ``Access-Control-*`` headers on the answers to allowed origins."""
    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.allow_origins or [],
        allow_origin_regex=LOOPBACK_ORIGINS if settings.allow_origins is None else None,
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=EXPOSED_HEADERS,
        max_age=settings.max_age_s,
    )
