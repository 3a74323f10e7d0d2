"""``auth.mode: langgraph``: the deployment's own ``langgraph_sdk.Auth`` decides who is calling.

The same file a LangGraph server loads (``auth.path: ./auth.py:auth``) works here: its
``@auth.authenticate`` handler is called as that server calls it. It names the parameters it wants,
from ``request`` (a Starlette ``Request`` without the body), ``headers`` (``dict[bytes, bytes]``, as
the SDK documents; ``str`` keys are accepted too, so ``headers.get("x-api-key")`` from the docs
works), ``authorization`` (the header, or ``None``), ``path``, ``method``, ``path_params`` (empty:
routing has not happened yet), ``query_params`` and ``scope``; a sync handler runs in a thread. It
returns the user: a string (the identity), a dict with ``identity`` (and optionally
``display_name``, ``permissions``, ``is_authenticated``), or an object with those attributes.

Its ``Auth.exceptions.HTTPException`` becomes the answer (status, detail, headers); an
``AssertionError`` is a 401, as on the LangGraph server; a user with ``is_authenticated: False``
is refused. The same object's ``@auth.on`` authorization handlers become the deployment's
``AuthRules`` (``auth_rules.py``), applied by ``access.py`` on every route.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from langgraph_sdk import Auth
from starlette.requests import Request
from starlette.types import Scope

from agentkeel.gateway.auth import AuthFailure, AuthSetupError, Identity
from agentkeel.gateway.auth_rules import AuthRules
from agentkeel.harness.graphs import GraphLoadError, load_reference

PARAMETERS = ("request", "headers", "authorization", "path", "method", "path_params", "query_params", "scope")


class Headers(dict[bytes, bytes]):
    """Request headers keyed by lower-case bytes, as the LangGraph server passes them, that also
    answer ``str`` keys (any case), as the LangGraph docs' examples use them."""

    @staticmethod
    def _key(key: bytes | str) -> bytes:
        return key.lower().encode("latin-1") if isinstance(key, str) else key

    def __getitem__(self, key: bytes | str) -> bytes:
        return super().__getitem__(self._key(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(self._key(key) if isinstance(key, (bytes, str)) else key)

    def get(self, key: bytes | str, default: Any = None) -> Any:
        return super().get(self._key(key), default)


class LangGraphAuth:
    """The authenticator of ``auth.mode: langgraph``."""

    def __init__(self, handler: Callable[..., Any], wanted: set[str], rules: AuthRules) -> None:
        self._handler = handler
        self._wanted = wanted
        self.rules = rules

    @classmethod
    def load(cls, ref: str, base_dir: Path) -> LangGraphAuth:
        try:
            auth = load_reference("auth.path", ref, base_dir)
        except GraphLoadError as exc:
            raise AuthSetupError(str(exc)) from None
        if not isinstance(auth, Auth):
            raise AuthSetupError(f"auth.path: {ref!r} is a {type(auth).__name__}, not a langgraph_sdk.Auth instance")
        handler = auth._authenticate_handler
        if handler is None:
            raise AuthSetupError(f"auth.path: {ref!r} has no @auth.authenticate handler")
        params = inspect.signature(handler).parameters
        unknown = [n for n, p in params.items() if n not in PARAMETERS and p.default is p.empty
                   and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if unknown:
            raise AuthSetupError(f"auth.path: the authenticate handler asks for {unknown}; it may ask for {list(PARAMETERS)}")
        return cls(handler, {n for n in params if n in PARAMETERS}, AuthRules(auth))

    def _arguments(self, scope: Scope) -> dict[str, Any]:
        request = Request(scope)  # no receive: the handler cannot consume the body
        values: dict[str, Callable[[], Any]] = {
            "request": lambda: request,
            "headers": lambda: Headers(scope["headers"]),
            "authorization": lambda: request.headers.get("authorization"),
            "path": lambda: scope["path"],
            "method": lambda: scope["method"],
            "path_params": lambda: dict(scope.get("path_params") or {}),
            "query_params": lambda: dict(request.query_params),
            "scope": lambda: scope,
        }
        return {name: values[name]() for name in self._wanted}

    async def __call__(self, scope: Scope) -> Identity:
        arguments = self._arguments(scope)
        try:
            if inspect.iscoroutinefunction(self._handler):
                user = await self._handler(**arguments)
            else:
                user = await asyncio.to_thread(self._handler, **arguments)
        except Auth.exceptions.HTTPException as exc:
            raise AuthFailure(str(exc.detail), exc.status_code, exc.headers or None) from None
        except AssertionError as exc:
            raise AuthFailure(str(exc) or "Unauthorized") from None
        return _identity(user)


def _identity(user: Any) -> Identity:
    """The handler's answer as an ``Identity``; an answer of no known shape is a handler bug (500)."""
    fields: Mapping[str, Any]
    if isinstance(user, str):
        fields = {"identity": user}
    elif isinstance(user, Mapping):
        fields = user
    elif hasattr(user, "identity"):
        fields = {name: getattr(user, name) for name in ("identity", "display_name", "permissions", "is_authenticated")
                  if hasattr(user, name)}
    else:
        raise TypeError(f"the authenticate handler returned {type(user).__name__}, not a user (str, dict or object with identity)")
    identity = fields.get("identity")
    if not isinstance(identity, str) or not identity:
        raise TypeError("the authenticate handler returned a user without a non-empty string identity")
    if fields.get("is_authenticated", True) is False:
        raise AuthFailure("Unauthorized")
    permissions = tuple(str(p) for p in fields.get("permissions") or ())
    claims = {k: v for k, v in fields.items() if k not in ("identity", "display_name", "permissions", "is_authenticated")}
    return Identity(identity, str(fields.get("display_name") or identity), permissions, claims)
