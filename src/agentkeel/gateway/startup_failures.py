"""A gateway whose runtime cannot open says why in one line, not in a traceback.

Why: Starlette reports a failed start-up by sending the whole traceback as the failure's message,
and uvicorn logs that message: a missing database came out as forty lines of ``contextlib``
frames ending in psycopg_pool's "pool initialization incomplete". The runtime raises a
``StartupError`` naming the setting and the cause (the database's own refusal); this middleware
sends that line as the failure's message instead, and keeps the error on ``app.state`` so that
``keel serve`` can exit with the status every command gives it. Any other start-up failure is
reported as before, traceback and all: it is a bug to be read, not a deployment to fix.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentkeel.runtime.startup import StartupError


class StartupFailures:
    """ASGI middleware (lifespan only): a ``StartupError`` becomes a one-line start-up failure."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def holding_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent once the exception says which kind of failure it was
            else:
                await send(message)

        try:
            await self.app(scope, receive, holding_failure)
        except StartupError as exc:
            scope["app"].state.startup_error = exc
            await send({"type": "lifespan.startup.failed", "message": f"cannot start: {exc}"})
            return  # reported: uvicorn logs the line, says "Application startup failed" and exits
        except BaseException:
            await _send_all(send, held)
            raise
        await _send_all(send, held)


async def _send_all(send: Send, messages: list[Message]) -> None:
    for message in messages:
        await send(message)
