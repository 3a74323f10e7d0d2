"""Request bodies are JSON whatever their ``Content-Type`` says.

Clients of the LangGraph API send JSON under other content types: LangChain's Agent Chat UI
forwards requests through its own ``/api`` route as ``text/plain``, and ``fetch`` with a string
body defaults to ``text/plain;charset=UTF-8``. FastAPI parses a body as JSON only when the type
says so and otherwise validates the raw bytes, which fails every route with a confusing 422. Every
body this API accepts is JSON, so the type is normalised before routing: a body that parses is
accepted, one that does not is a 422 saying the JSON is invalid (``errors``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

_JSON = b"application/json"
_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _is_json(content_type: bytes) -> bool:
    essence = content_type.split(b";", 1)[0].strip().lower()
    return essence == _JSON or essence.endswith(b"+json")


class JsonBodies:
    """ASGI middleware: a request with a body and a non-JSON ``Content-Type`` is read as JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _WITH_BODY:
            declared = [v for k, v in scope["headers"] if k == b"content-type"]
            if declared and not _is_json(declared[0]):  # none declared: FastAPI reads JSON already
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", _JSON)]}
        await self.app(scope, receive, send)
