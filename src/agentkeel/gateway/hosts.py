"""DNS rebinding: which names a request may address the gateway by (its ``Host`` header).

A web page on ``evil.example`` can make its own name resolve to ``127.0.0.1`` a moment after it
loaded. The browser then sends the page's requests to the local gateway and, since page and API
now share an origin, lets the page read the answers: CORS never applies. What gives it away is the
``Host`` header, which still says ``evil.example``. So every request passes ``HostCheck`` first,
outermost (before CORS, so a preflight is refused too, and before anything is read or written):
a name not in ``gateway.allowed_hosts`` is a 400 naming ``Host``.

Default: the loopback names (``localhost``, ``127.0.0.1``, ``::1``) plus the address
``keel serve --host`` binds. ``["*"]`` allows any name (a proxy in front checks them). The port
is not compared (the gateway may sit behind a port mapping); names compare case-insensitively,
IPv6 addresses with or without their brackets.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str | None:
    """The name of a ``Host`` value (``name[:port]``, ``[v6][:port]``), lower-cased and without
    brackets; ``None`` if it is not of that shape."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, port = value[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        return name or None
    if value.count(":") > 1:  # an IPv6 address without brackets: no port to split off
        return value
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    return name or None


def allowed_names(configured: list[str] | None, bound: str | None) -> frozenset[str] | None:
    """The names to admit (``None``: any). ``configured`` is ``gateway.allowed_hosts``; unset,
    the loopback names and ``bound`` (the address the server listens on) are allowed."""
    if configured is not None and "*" in configured:
        return None
    names: Iterable[str] = configured if configured is not None else (*LOOPBACK_NAMES, *([bound] if bound else []))
    return frozenset(name.strip().strip("[]").lower() for name in names)


class HostCheck:
    """ASGI middleware answering 400 to a request whose ``Host`` is not allowed; see the module
    docstring. A request without ``Host`` (HTTP/1.0) is refused too, unless any name is allowed."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed is None:
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("host")
        if given is not None and host_name(given) in self.allowed:
            await self.app(scope, receive, send)
            return
        shown = "missing" if given is None else repr(given[:100])
        detail = (f"Host: {shown} is not a name this server answers to "
                  "(gateway.allowed_hosts; the default is the loopback names)")
        await JSONResponse({"detail": detail, "field": "Host"}, status_code=400)(scope, receive, send)
