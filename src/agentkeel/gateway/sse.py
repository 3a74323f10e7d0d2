"""Streaming answers about a run: its SSE event stream, and chunked bodies written at its END.

SSE frames follow the LangGraph server: ``event: <name>`` + one-line JSON ``data`` + ``id: N-0`` on
every data event (of every run: all AgentKeel runs are resumable; an event the renderer turned into
several frames carries it on the last, and not while the renderer holds text back),
``: heartbeat`` comments at most ``gateway.heartbeat_s`` apart (the JS SDK's idle watchdog learns
its timeout from them), the stream closed after the run's END (optionally preceded by
``event: end``). A ``gap`` (events trimmed before this client read them) is forwarded, so the
client knows to reload durable state.

Errors found before the response starts (unknown run, malformed ``Last-Event-ID``, this process at
its ``limits.stream_max_subscribers``) are raised to the caller and become JSON errors; once
streaming, a failure is an ``error`` event and the close. So is a ``Last-Event-ID`` beyond the
run's last event (``LastEventIdAhead``): the client's cursor belongs to another stream.

A client going away is not a request to stop the run, unless it said so (``on_disconnect=cancel``,
``cancel_on_disconnect=true``); then the run is cancelled with stop reason ``client_disconnected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from typing import Any, cast

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import StreamingResponse

from agentkeel.gateway.deps import Gateway
from agentkeel.gateway.render import ModeRenderer
from agentkeel.runtime.bridge import LIVE, EventKind, StreamEvent, parse_event_id
from agentkeel.runtime.bridge.base import encode_data
from agentkeel.runtime.observe import RUN_RECORD_EVENT, observe

log = logging.getLogger(__name__)

# The route arguments of an endpoint answering with ``event_stream``: OpenAPI then says
# ``text/event-stream`` for its 200, not FastAPI's default JSON (errors stay JSON: ``ErrorBody``).
STREAM_ROUTE: dict[str, Any] = {
    "response_class": EventSourceResponse,
    "responses": {200: {"description": "Server-sent events (docs/api.md)", "content": {"text/event-stream": {}}}},
}


def event_stream(
    gw: Gateway,
    run_id: str,
    *,
    modes: list[str],
    last_event_id: str | None,
    cancel_on_disconnect: bool,
    headers: Mapping[str, str] | None = None,
) -> EventSourceResponse:
    """The run's events after ``last_event_id`` (``LIVE``: only what comes after joining).

    Raises ``InvalidEventId`` for a malformed cursor and ``TooManySubscribers`` when the process
    serves its limit of subscribers, before anything is sent.
    """
    parse_event_id(last_event_id)
    gw.runtime.bridge.check_capacity()
    frames = _frames(gw, run_id, modes, last_event_id, cancel_on_disconnect)
    return EventSourceResponse(
        frames,
        headers=dict(headers or {}),
        ping=gw.settings.heartbeat_s,
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
    )


def sse_frame(name: str, data: Any, event_id: str | None = None) -> bytes:
    """One SSE frame, written as bytes: a published event's data arrives as its published JSON
    (an ``orjson.Fragment``, see ``frame_data``) and is copied in, never encoded again. Compact
    JSON has no raw newline, so it is always a single ``data:`` line; a line break in a name (a
    user graph's node name ends up in ``mode|namespace``) is dropped, as sse-starlette does."""
    if "\n" in name or "\r" in name:
        name = name.replace("\r", "").replace("\n", "")
    head = f"id: {event_id}\r\nevent: {name}\r\ndata: " if event_id else f"event: {name}\r\ndata: "
    return b"".join((head.encode(), encode_data(data), b"\r\n\r\n"))


def frame_data(renderer: ModeRenderer, item: StreamEvent) -> Any:
    """What ``renderer.feed`` gets for ``item``: objects only for the events it looks into
    (``messages``), the published bytes as an ``orjson.Fragment`` for everything it passes on."""
    if not item.encoded or renderer.reads(item.event):
        return item.data
    return orjson.Fragment(item.raw)


async def _frames(
    gw: Gateway, run_id: str, modes: list[str], last_event_id: str | None, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    renderer = ModeRenderer(modes)
    finished = False  # closed by us (END or a failure), not torn down by a disconnect
    gw.metrics.streams_open += 1
    try:
        items = follow_run(gw, run_id, last_event_id)
        async with contextlib.aclosing(items):
            async for item in items:
                if item.kind is EventKind.data and item.event == RUN_RECORD_EVENT:
                    # The stream was reaped: a replaying client gets the durable record instead.
                    if last_event_id != LIVE:
                        yield sse_frame(RUN_RECORD_EVENT, item.data)
                elif item.kind in (EventKind.data, EventKind.gap):
                    frames = renderer.feed(item.event, frame_data(renderer, item))
                    for frame in rendered_frames(gw, frames, item.id, renderer.holding):
                        yield frame
                elif item.kind is EventKind.error:
                    finished = True
                    yield sse_frame("error", item.data)
                    return
                elif item.kind is EventKind.end:
                    for frame in rendered_frames(gw, renderer.flush(), None, False):
                        yield frame
                    finished = True
                    if gw.settings.end_event:
                        yield sse_frame("end", None)
                    return
    except Exception as exc:
        log.exception("run %s: event stream failed", run_id)
        finished = True
        for frame in rendered_frames(gw, renderer.flush(), None, False):
            yield frame
        yield sse_frame("error", {"error": type(exc).__name__, "message": "the event stream failed; reconnect with Last-Event-ID"})
    finally:
        gw.metrics.streams_open -= 1
        if not finished and cancel_on_disconnect:
            cancel_on_client_disconnect(gw, run_id)


def rendered_frames(
    gw: Gateway, frames: list[tuple[str, Any]], event_id: str | None, holding: bool
) -> list[bytes]:
    """SSE frames for what one event became. Its id goes on the last of them, and only if the
    renderer holds nothing back: a client resuming after that id has then seen everything up to it
    (a client resuming from an earlier id may see some frames twice, never miss one)."""
    gw.metrics.stream_events_sent += len(frames)
    last = len(frames) - 1
    return [
        sse_frame(name, data, event_id if index == last and event_id and not holding else None)
        for index, (name, data) in enumerate(frames)
    ]


def follow_run(gw: Gateway, run_id: str, last_event_id: str | None) -> AsyncGenerator[StreamEvent, None]:
    """``observe`` typed as the generator it is, so callers can close it when they stop early."""
    return cast(AsyncGenerator[StreamEvent, None], observe(gw.runtime, run_id, last_event_id=last_event_id))


def cancel_on_client_disconnect(gw: Gateway, run_id: str) -> None:
    """Cancel the run in the background: this runs while the response is being torn down."""
    gw.spawn(
        gw.runtime.manager.cancel(
            run_id, code="client_disconnected", source="gateway", detail="the client disconnected"
        ),
        name=f"agentkeel-disconnect-{run_id}",
    )


async def until_end(gw: Gateway, run_id: str) -> None:
    """Return once the run's END marker is published (at once if it already was), or its record
    says it finished (``observe`` checks at every heartbeat)."""
    items = follow_run(gw, run_id, LIVE)
    async with contextlib.aclosing(items):
        async for _item in items:
            pass


def json_when_done(
    gw: Gateway,
    result: Awaitable[Any],
    *,
    cancel_run_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> StreamingResponse:
    """A 200 JSON answer written when ``result`` is ready, with a newline every
    ``gateway.wait_keepalive_s`` until then (JSON parsers skip leading whitespace; proxies and
    clients see a live connection). If the client leaves first and ``cancel_run_id`` is given,
    that run is cancelled."""
    return StreamingResponse(
        _json_when_done(gw, result, cancel_run_id),
        media_type="application/json",
        headers=dict(headers or {}),
    )


async def _json_when_done(gw: Gateway, result: Awaitable[Any], cancel_run_id: str | None) -> AsyncIterator[bytes]:
    waiter = asyncio.ensure_future(result)
    answered = False
    try:
        while not waiter.done():
            await asyncio.wait({waiter}, timeout=gw.settings.wait_keepalive_s)
            if not waiter.done():
                yield b"\n"
        answered = True
        try:
            body = waiter.result()
        except Exception as exc:  # the status line is long gone: answer in the body
            log.exception("computing a run result failed")
            body = {"__error__": {"error": type(exc).__name__, "message": "could not read the run's result"}}
        yield encode_data(body)
    finally:
        if not answered:
            waiter.cancel()
            if cancel_run_id is not None:
                cancel_on_client_disconnect(gw, cancel_run_id)
