"""HTTP requests go before the chunks of runs already streaming.

Why: a request to this gateway -- creating a thread, admitting a run, reading state -- is a few
awaits on the one event loop that also executes every run of the process, and each of those
awaits waits behind one burst of work of every running run (asyncio hands out turns in FIFO
order). Under ten busy runs a ``POST /threads`` took hundreds of milliseconds for a millisecond of
work. So a request holds the runtime's start gate (``runtime/start_gate.py``) until its response
starts, and running runs step aside at their next chunk meanwhile. A hold lapses after
``REQUEST_HOLD_S``: a ``/wait`` or ``/join`` starts its response only when its run ends, and must
not slow the others for that long. Admitting and starting a run holds the gate on its own, in the
runtime, until the run's first chunk is out.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_HOLD_S = 0.2


class RequestsFirst:
    """ASGI middleware: each HTTP request holds the start gate until its response starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway = getattr(scope["app"].state, "gateway", None) if scope["type"] == "http" else None
        if gateway is None:  # lifespan, or before start-up finished
            await self.app(scope, receive, send)
            return
        release = gateway.runtime.manager.start_gate.hold(REQUEST_HOLD_S)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            release()


__all__ = ["REQUEST_HOLD_S", "RequestsFirst"]
