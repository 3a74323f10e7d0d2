"""How failures become HTTP answers: always JSON ``{"detail": ...}``, never a traceback.

Every 4xx and 5xx body has one shape, ``ErrorBody``: ``detail`` (the message, which names the
offending field, since clients such as the LangGraph SDKs show only ``detail``) and, when one
field is at fault, ``field`` (``config.recursion_limit``, ``Host``, ``body``). ``ERROR_RESPONSES``
publishes that shape in OpenAPI for every route at once (``create_app`` hands it to the app), in
place of FastAPI's default 422 schema, which describes a list this gateway never sends.

The status codes follow the LangGraph server (the SDKs map them to exception classes): 404 for a
missing thread, run or assistant; 409 for a busy thread under ``reject``; 422 for an invalid body
(naming the field); 503 while shutting down, and for a stream this process has no subscriber
slot left for (``limits.stream_max_subscribers``); 413 for a body over ``gateway.max_body_bytes``
(``input_limits``). Anything unexpected is logged with its traceback and answered with a bare JSON
500, so internals never leak to a caller.

That 500 comes from ``InternalErrors``, not from an exception handler: Starlette re-raises the
exception after such a handler answers, and uvicorn then closes the keep-alive connection, so one
failed request would cost a client its connection (and any request pipelined on it).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentkeel.harness.agents import UnknownAssistant
from agentkeel.runtime.bridge import InvalidEventId, TooManySubscribers
from agentkeel.runtime.manager import ShuttingDown
from agentkeel.runtime.records import ConflictError
from agentkeel.runtime.requests import RequestError

log = logging.getLogger(__name__)

BUSY_THREAD = (
    "Thread is already running a task. Wait for it to finish or choose a different multitask strategy."
)


class ErrorBody(BaseModel):
    """The body of every 4xx and 5xx answer (from the handlers below, ``HTTPException``,
    ``input_limits``, ``hosts`` and Starlette's own 404/405)."""

    detail: str = Field(description="What was refused and why; names the field when one is at fault.")
    field: str | None = Field(
        default=None, description="The offending field (dotted path, 'body', or a header name); absent otherwise."
    )


# Declared on every route (the app's ``responses``): OpenAPI range keys, so a status added later
# is described too, and FastAPI no longer adds its ``HTTPValidationError`` 422. Always JSON, even
# on a route whose success is text or a stream, hence ``content`` rather than FastAPI's ``model``
# (which takes the route's media type); ``publish_error_body`` adds the schema it refers to.
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"description": "Refused: the request is invalid, names something missing, or conflicts.",
            "content": _ERROR_CONTENT},
    "5XX": {"description": "Unavailable (503, retry later) or an unexpected failure (500).", "content": _ERROR_CONTENT},
}


def publish_error_body(openapi: dict[str, Any]) -> dict[str, Any]:
    """``openapi`` with the ``ErrorBody`` schema that ``ERROR_RESPONSES`` refers to (in place)."""
    openapi.setdefault("components", {}).setdefault("schemas", {})["ErrorBody"] = ErrorBody.model_json_schema()
    return openapi


class NotFound(LookupError):
    """A thread, run or assistant the request names does not exist (404)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _json(status: int, detail: str, **extra: object) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status)


def _field_of(location: tuple[object, ...]) -> str:
    """``("body", "config", "recursion_limit")`` -> ``config.recursion_limit``."""
    parts = [str(p) for p in location]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


# What the LangGraph server answers for each kind of refused request.
_PROBLEM_STATUS = {"invalid": 422, "not_found": 404, "not_allowed": 400}


async def _request_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestError)
    return _json(_PROBLEM_STATUS[exc.problem], exc.message, field=exc.field)


def _problem(error: dict[str, Any]) -> tuple[str, str]:
    """(field, message) of one validation error; a body that is not JSON names its parse error."""
    location = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "not JSON")
        where = f" at character {location[1]}" if len(location) > 1 else ""
        return "body", f"invalid JSON ({reason}{where})"
    return _field_of(location), str(error.get("msg", "invalid"))


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [_problem(e) for e in exc.errors()]
    detail = "; ".join(f"{field}: {message.removeprefix('Value error, ')}" for field, message in problems)
    return _json(422, detail or "invalid request", field=problems[0][0] if problems else "body")


async def _conflict(_request: Request, exc: Exception) -> JSONResponse:
    return _json(409, str(exc))


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return _json(404, exc.detail if isinstance(exc, NotFound) else str(exc))


async def _invalid_event_id(_request: Request, exc: Exception) -> JSONResponse:
    return _json(422, str(exc), field="Last-Event-ID")


async def _shutting_down(_request: Request, exc: Exception) -> JSONResponse:
    """Unavailable for now (draining, or no stream subscriber slot left): retry later."""
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})


class InternalErrors:
    """ASGI middleware: an exception no handler took is logged and answered with a JSON 500, and
    not re-raised, so the connection stays usable. Once a response has started (a stream) there is
    nothing left to answer with: the exception goes on and the server closes the connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.error("%s %s failed", scope["method"], scope["path"], exc_info=exc)
            await _json(500, "internal error")(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestError, _request_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ConflictError, _conflict)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(UnknownAssistant, _not_found)
    app.add_exception_handler(InvalidEventId, _invalid_event_id)
    app.add_exception_handler(ShuttingDown, _shutting_down)
    app.add_exception_handler(TooManySubscribers, _shutting_down)
