"""Bounds on what a request may carry, checked once, before any route runs or anything is written.

Hostile input found on the unbounded gateway: a 100 MB body was buffered whole (+533 MB RSS);
integers of 2^63 and more overflowed SQLite; NUL characters made PostgreSQL fail; metadata nested
900 deep was admitted, *run*, and then broke the thread's run list for good. Each became a 500
after something had been stored. So every request passes through ``InputLimits`` first:

- the body is read up to ``gateway.max_body_bytes`` and no further (a ``Content-Length`` over it
  is refused before reading): 413 naming the limit;
- a JSON body is parsed and walked once: nesting deeper than ``gateway.max_json_depth``, an
  integer outside the signed 64-bit range, a non-finite number (``NaN``, ``Infinity``, ``1e400``),
  a string or key with a NUL character or a lone surrogate (message content included: no store
  keeps them faithfully), a ``messages`` list longer than ``gateway.max_messages``, or a top-level
  ``metadata`` larger than ``gateway.max_metadata_bytes`` serialized: 422 naming the field;
- query parameters with a NUL character, and path segments that are not an id (1-128 letters,
  digits, ``_``, ``.``, ``-``; the segment after ``threads`` is named ``thread_id``, and so on): 422.
  ``publish_segment_shape`` writes that shape into OpenAPI on every path parameter, so clients
  and fuzzers see the rule the gateway enforces.

A body that is not JSON at all passes through unchanged, so FastAPI answers it as it always did.
The body is parsed twice (here and by FastAPI): bounded by the size limit, that costs little next
to a run. Ranges of individual parameters (page sizes, offsets, ``after_seconds``) are declared
on the routes' models, which name them in OpenAPI.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi.responses import JSONResponse
from pydantic import StringConstraints
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentkeel.config import GatewayConfig

_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_SEGMENT_FIELD = {"threads": "thread_id", "runs": "run_id", "assistants": "assistant_id"}
_INT64 = 2**63
MAX_PAGE = 1_000_000  # page sizes (``limit``) of every listing
MAX_OFFSET = _INT64 - 1  # offsets and sequence numbers: what a 64-bit column holds
# A thread or run id given in a body: the shape the path segments are held to.
Id = Annotated[str, StringConstraints(pattern=_SEGMENT.pattern)]


class InputRefused(Exception):
    """A request out of bounds: answered ``status`` with ``field`` named, before any route runs."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def _field(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "body"


def _check_string(text: str, path: tuple[str | int, ...]) -> None:
    if "\x00" in text:
        raise InputRefused(422, _field(path), "must not contain NUL characters (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputRefused(422, _field(path), "must not contain lone UTF-16 surrogates") from None


def check_json(value: Any, config: GatewayConfig) -> None:
    """Walk a parsed body iteratively (no recursion limit to hit); raise ``InputRefused`` at the
    first value out of bounds."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_string(item, path)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -_INT64 <= item < _INT64:
                raise InputRefused(422, _field(path), "integer out of range (must fit in 64 bits)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InputRefused(422, _field(path), "must be a finite number")
        elif isinstance(item, (dict, list)):
            if len(path) >= config.max_json_depth:
                raise InputRefused(422, _field(path), f"nested deeper than {config.max_json_depth} levels")
            if isinstance(item, list):
                if path and path[-1] == "messages" and len(item) > config.max_messages:
                    raise InputRefused(422, _field(path), f"more than {config.max_messages} messages")
                stack.extend((v, (*path, i)) for i, v in enumerate(item))
                continue
            for key, child in item.items():
                _check_string(key, (*path, key))
                stack.append((child, (*path, key)))
    metadata = value.get("metadata") if isinstance(value, dict) else None
    if isinstance(metadata, dict):  # serialized only once known to be shallow
        if len(json.dumps(metadata, ensure_ascii=False).encode()) > config.max_metadata_bytes:
            raise InputRefused(422, "metadata", f"larger than {config.max_metadata_bytes} bytes")


def _reject_constant(name: str) -> Any:
    raise InputRefused(422, "body", f"{name} is not a JSON number")


def _check_body(body: bytes, config: GatewayConfig) -> None:
    try:
        parsed = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise InputRefused(422, "body", f"nested deeper than {config.max_json_depth} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # not JSON: FastAPI answers it as invalid JSON, naming the position
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise InputRefused(422, "body", str(exc)) from None
    check_json(parsed, config)


def _check_target(scope: Scope) -> None:
    previous = ""
    for segment in str(scope.get("path", "")).split("/"):
        if segment and not _SEGMENT.match(segment):
            field = _SEGMENT_FIELD.get(previous, "path")
            raise InputRefused(422, field, "must be 1-128 characters of letters, digits, '_', '.', '-'")
        previous = segment
    query = scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(query, keep_blank_values=True):
        _check_string(key, (key,))
        _check_string(value, (key,))


_FILTER_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_filter_keys(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A metadata filter (store search, thread history) whose keys the SQL backends accept (they
    become JSON paths in SQL; SQLite raised on ``""``, a 500 the fuzzer found). Held on every
    backend, so a filter that works on memory keeps working on SQLite and PostgreSQL. For a
    pydantic ``field_validator``: raises ``ValueError`` naming the key."""
    bad = [key for key in value or {} if not _FILTER_KEY.match(key)]
    if bad:
        raise ValueError(f"key {bad[0][:100]!r} must be letters, digits, '_', '.', '-'")
    return value


def publish_segment_shape(openapi: dict[str, Any]) -> dict[str, Any]:
    """``openapi`` with every path parameter's schema stating the id shape ``_check_target``
    enforces (in place; applying it twice changes nothing)."""
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path":
                    title = parameter.get("schema", {}).get("title")
                    parameter["schema"] = {"type": "string", "pattern": _SEGMENT.pattern, **({"title": title} if title else {})}
    return openapi


class InputLimits:
    """ASGI middleware enforcing the bounds above; see the module docstring."""

    def __init__(self, app: ASGIApp, config: GatewayConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            _check_target(scope)
            if scope["method"] not in _WITH_BODY:
                await self.app(scope, receive, send)
                return
            body = await self._read_body(scope, receive)
            if body is None:
                return  # the client went away
            if body:
                _check_body(body, self.config)
        except InputRefused as refused:
            response = JSONResponse({"detail": f"{refused.field}: {refused.message}", "field": refused.field},
                                    status_code=refused.status)
            await response(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = self.config.max_body_bytes
        too_large = InputRefused(413, "body", f"larger than the limit of {limit} bytes (gateway.max_body_bytes)")
        declared = [v for k, v in scope["headers"] if k == b"content-length"]
        if declared and declared[0].isdigit() and int(declared[0]) > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the client's own messages (a disconnect, for streams)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
