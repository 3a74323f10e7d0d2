"""Authentication: who is calling, decided once per request before any route runs.

``Authentication`` is an ASGI middleware placed inside CORS and the ``Host`` check (a browser
preflight carries no credentials and is answered by CORS before it gets here; a 401 still gets
CORS headers, so a browser client can read it) and outside everything that reads a body, so an
unauthenticated caller cannot make the server parse anything. It asks the authenticator of
``auth.mode`` (``api_keys`` here, ``jwt`` in ``auth_tokens``, ``langgraph`` in ``auth_langgraph``)
for an ``Identity`` and puts it on ``request.state.identity``; the ``current_user`` dependency is
the one place routes (through ``access.py``, which decides what the caller may see) read it. A refusal is a JSON 401
``{"detail": ...}`` with ``WWW-Authenticate``, never a 500.

Open without credentials (``OPEN_PATHS``): the health probes (``/ok``, ``/healthz``, ``/readyz``,
which load balancers call bare), ``/info`` (the server's version, which clients read first), the
API description (``/docs``, ``/redoc``, ``/openapi.json``: public, the same for every deployment)
and the console's page and static files (``/console``, ``/console/assets/...``: no data in them).
Everything else, ``/metrics`` included, needs credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from agentkeel.config import AuthConfig, KeelConfig

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/ok", "/healthz", "/readyz", "/info", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/console"})
OPEN_PREFIXES = ("/console/assets/",)  # the console's static files; its data routes (/console/api/) need credentials
ADMIN_PERMISSION = "admin"
BEARER_CHALLENGE = 'Bearer realm="agentkeel"'


@dataclass(frozen=True)
class Identity:
    """The authenticated caller. ``user_id`` becomes ``RunRequest.user`` (the run's trusted
    ``RunContext.user``); ``permissions`` come from the key entry, the token's ``permissions`` or
    ``scope`` claim, or the LangGraph handler; ``admin`` among them makes ``is_admin``."""

    user_id: str
    display_name: str
    permissions: tuple[str, ...] = ()
    claims: Mapping[str, Any] = field(default_factory=dict)  # what the token or handler said besides

    @property
    def is_admin(self) -> bool:
        return ADMIN_PERMISSION in self.permissions


class AuthFailure(Exception):
    """A refused request: ``status`` (401 unless a LangGraph handler chose another), ``detail``."""

    def __init__(self, detail: str, status: int = 401, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.headers = dict(headers) if headers is not None else ({"WWW-Authenticate": BEARER_CHALLENGE} if status == 401 else {})


class AuthSetupError(ValueError):
    """``auth:`` cannot be put to work (a key variable unset, ``path`` not an ``Auth``); the
    message starts with the key path, like ``ConfigError``."""


Authenticator = Callable[[Scope], Awaitable[Identity]]


def bearer_token(scope: Scope) -> str | None:
    """The credential of ``Authorization: Bearer <token>`` (scheme case-insensitive)."""
    value = Headers(scope=scope).get("authorization")
    scheme, _, token = (value or "").strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


class ApiKeys:
    """``auth.mode: api_keys``: the key in ``x-api-key`` (what the LangGraph SDKs send for
    ``api_key=``) or ``Authorization: Bearer`` (what Prometheus and curl users reach for first).
    Keys are compared as SHA-256 digests with ``hmac.compare_digest``, against every entry, so
    neither the time taken nor a key's length tells a caller how close a guess was."""

    def __init__(self, config: AuthConfig, environ: Mapping[str, str]) -> None:
        self._keys: list[tuple[bytes, Identity]] = []
        seen: dict[str, int] = {}
        for index, entry in enumerate(config.api_keys):
            value = environ.get(entry.key_env, "")
            if not value.strip():
                raise AuthSetupError(f"auth.api_keys.{index}.key_env: environment variable {entry.key_env} is not set or empty")
            if value in seen:
                raise AuthSetupError(f"auth.api_keys.{index}.key_env: the same key as auth.api_keys.{seen[value]} (each user needs its own)")
            seen[value] = index
            identity = Identity(entry.user, entry.user, tuple(entry.permissions))
            self._keys.append((_digest(value), identity))

    async def __call__(self, scope: Scope) -> Identity:
        given = Headers(scope=scope).get("x-api-key") or bearer_token(scope)
        if not given:
            raise AuthFailure("missing API key: send it in the x-api-key header (or Authorization: Bearer <key>)")
        digest = _digest(given)
        found = None
        for key, identity in self._keys:
            if hmac.compare_digest(digest, key):
                found = identity
        if found is None:
            raise AuthFailure("invalid API key")
        return found


def build_authenticator(config: AuthConfig, base_dir: Path, environ: Mapping[str, str] | None = None) -> Authenticator | None:
    """The authenticator of ``auth.mode`` (``None`` for ``none``), with every secret read and user
    code loaded now, at start-up; a problem is an ``AuthSetupError`` naming the key."""
    env = os.environ if environ is None else environ
    if config.mode == "api_keys":
        return ApiKeys(config, env)
    if config.mode == "jwt":
        try:
            from agentkeel.gateway.auth_tokens import JwtTokens
        except ImportError as exc:  # PyJWT is the optional extra ``auth``
            raise AuthSetupError(f"auth.mode: jwt needs PyJWT ({exc}); install agentkeel[auth]") from None

        return JwtTokens(config.jwt, env)
    if config.mode == "langgraph":
        from agentkeel.gateway.auth_langgraph import LangGraphAuth

        assert config.path is not None  # AuthConfig requires it for this mode
        return LangGraphAuth.load(config.path, base_dir)
    return None


class Authentication:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        try:
            identity = await self.authenticator(scope)
        except AuthFailure as failure:
            response = JSONResponse({"detail": failure.detail}, status_code=failure.status, headers=failure.headers)
            await response(scope, receive, send)
            return
        except Exception as exc:  # a broken handler or key source: logged, and the request refused
            log.error("authentication of %s %s failed", scope["method"], scope["path"], exc_info=exc)
            await JSONResponse({"detail": "authentication failed: internal error"}, status_code=500)(scope, receive, send)
            return
        scope.setdefault("state", {})["identity"] = identity
        await self.app(scope, receive, send)


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthFailure)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)


def install_auth(app: FastAPI, config: KeelConfig) -> None:
    """Authenticate every request of ``app`` as ``config.auth`` says (nothing for mode ``none``);
    mode ``langgraph`` also puts the ``Auth`` object's ``@auth.on`` rules on ``app.state.auth_rules``
    for ``access.py``, whose refusals (``AuthFailure`` raised in a route) answer like a 401 here."""
    authenticator = build_authenticator(config.auth, config.base_dir)
    if authenticator is not None:
        app.add_middleware(Authentication, authenticator=authenticator)
        app.add_exception_handler(AuthFailure, _refused)
        app.state.auth_rules = getattr(authenticator, "rules", None)


def current_user(request: Request) -> Identity | None:
    """FastAPI dependency: the caller's identity; ``None`` when ``auth.mode`` is ``none``."""
    identity = getattr(request.state, "identity", None)
    return identity if isinstance(identity, Identity) else None
