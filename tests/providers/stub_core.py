"""What the OpenAI- and Anthropic-compatible stub servers share: the script queue, the request log,
the control API and the process entry point.

Why our own stubs: the provider packages (``langchain-openai``, ``langchain-anthropic``) must be
driven over real HTTP, with the failures real providers produce (rate limits, billing stops, stalls,
malformed tool-call JSON) on demand, and with request validation as strict as the real providers',
so a grammar bug in what we send fails a test instead of passing against a lenient fake.

A test scripts the next responses with ``POST /_script`` (a list of steps, see ``Step``), reads every
request received with ``GET /_requests`` (arrival time ``at`` on the stub's monotonic clock, headers, body, the
violations found and what was answered)
and clears both with ``POST /_reset``. With the queue empty the stub answers the default text
``"ok"``; a step with ``repeat: true`` stays at the head of the queue (a persistent 429).

A step (JSON object, every key optional):
- ``text``: the answer's text; ``chunks``: how many stream deltas it is split into (default 2).
- ``tool_calls``: ``[{"name", "arguments", "id"?}]``; ``arguments`` is the *raw* string sent (so a
  test can send malformed or truncated JSON); an object is JSON-encoded; ``arg_chunks`` (default 3).
- ``finish``: the provider's own finish/stop reason (default: tool calls -> ``tool_calls`` /
  ``tool_use``, else ``stop`` / ``end_turn``).
- ``usage``: ``{"input": n, "output": m}`` (default 20 / 5); ``no_usage: true``: report none, even
  when asked (as some OpenAI-compatible servers do; the Anthropic stub always reports it).
- ``error``: a preset name of the provider module (``rate_limit``, ``insufficient_quota``, ``server``,
  ``overloaded``, ``auth``, ``invalid_request``, ``context_length``) or ``{"preset"?, "status"?,
  "type"?, "code"?, "message"?}``; ``retry_after`` (seconds, header ``retry-after``, and
  ``retry-after-ms`` for OpenAI).
- ``delay_s``: sleep before the response headers; ``stall_s``: in a stream, sleep after
  ``stall_after`` (default 1) events; in a non-stream response, sleep before answering;
  ``pace_s``: in a stream, sleep before every event (a slow model that keeps producing).
- ``repeat``: keep this step at the head of the queue.
- ``match``: a substring; the step is served only to a request whose body contains it (in the body
  as sent, or in any string inside its JSON, so escaping does not matter). Each request takes the
  first queued ``match`` step it contains, else the first step without ``match`` (else the default
  answer). So a test can answer calls it cannot predict the order of — a summary call arriving
  whenever compaction triggers — with ``{"match": "<text of that prompt>", "repeat": true, ...}``
  while the run's own turns play in order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEFAULT_TEXT = "ok"
DEFAULT_USAGE = {"input": 20, "output": 5}


class Rejected(Exception):
    """A request the real provider would refuse: answered in the provider's error shape."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass
class ToolCall:
    name: str
    arguments: str  # raw, possibly not JSON
    id: str


@dataclass
class Step:
    """One scripted response, normalised (see the module docstring for the JSON keys)."""

    text: str
    chunks: int
    tool_calls: list[ToolCall]
    arg_chunks: int
    finish: str | None
    usage: dict[str, int]
    no_usage: bool
    error: dict[str, Any] | None
    retry_after: float | None
    delay_s: float
    stall_s: float
    stall_after: int
    pace_s: float
    repeat: bool
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: dict[str, Any], serial: int) -> Step:
        calls = []
        for i, call in enumerate(raw.get("tool_calls") or []):
            args = call.get("arguments", {})
            calls.append(ToolCall(
                name=call["name"],
                arguments=args if isinstance(args, str) else json.dumps(args),
                id=call.get("id") or f"call_{serial}_{i}",
            ))
        match = raw.get("match")
        if match is not None and (not isinstance(match, str) or not match):
            raise ValueError(f"step key 'match' must be a non-empty string (got {match!r})")
        error = raw.get("error")
        if isinstance(error, str):
            error = {"preset": error}
        text = raw.get("text")
        return cls(
            text=(DEFAULT_TEXT if not calls and error is None else "") if text is None else text,
            chunks=max(1, int(raw.get("chunks", 2))),
            tool_calls=calls,
            arg_chunks=max(1, int(raw.get("arg_chunks", 3))),
            finish=raw.get("finish"),
            usage={**DEFAULT_USAGE, **(raw.get("usage") or {})},
            no_usage=bool(raw.get("no_usage", False)),
            error=error,
            retry_after=raw.get("retry_after"),
            delay_s=float(raw.get("delay_s", 0)),
            stall_s=float(raw.get("stall_s", 0)),
            stall_after=int(raw.get("stall_after", 1)),
            pace_s=float(raw.get("pace_s", 0)),
            repeat=bool(raw.get("repeat", False)),
            raw=raw,
        )


def split(text: str, parts: int) -> list[str]:
    """``text`` in ``parts`` pieces of near-equal size (fewer if it is shorter); never empty pieces."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i:i + size] for i in range(0, len(text), size)]


class Provider:
    """What one provider module supplies to the shared app."""

    path: str
    name: str

    def check_headers(self, headers: dict[str, str]) -> None:
        raise NotImplementedError

    def validate(self, body: Any) -> list[str]:
        """Every violation of the provider's request grammar in ``body`` (empty: valid)."""
        raise NotImplementedError

    def error_response(self, status: int, kind: str, message: str, code: str | None = None,
                       headers: dict[str, str] | None = None) -> Response:
        raise NotImplementedError

    def scripted_error(self, step: Step) -> Response:
        raise NotImplementedError

    def complete(self, step: Step, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def stream(self, step: Step, body: dict[str, Any]) -> list[str]:
        """The SSE frames (already formatted) of a streamed answer."""
        raise NotImplementedError


class StubState:
    """The queue (raw steps, parsed when served, so a repeated step gets fresh tool-call ids) and
    the log of one stub process."""

    def __init__(self) -> None:
        self.queue: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.serial = 0

    def next_step(self, body: str, strings: list[str]) -> Step:
        """The step for a request whose body text is ``body`` (``strings``: the strings inside
        its JSON): the first ``match`` step it contains, else the first step without ``match``."""
        self.serial += 1
        index = next((i for i, raw in enumerate(self.queue) if _matches(raw.get("match"), body, strings)), None)
        if index is None:
            index = next((i for i, raw in enumerate(self.queue) if raw.get("match") is None), None)
        if index is None:
            return Step.parse({}, self.serial)
        raw = self.queue[index]
        if not raw.get("repeat"):
            self.queue.pop(index)
        return Step.parse(raw, self.serial)


def _matches(needle: Any, body: str, strings: list[str]) -> bool:
    return isinstance(needle, str) and (needle in body or any(needle in s for s in strings))


def _strings(value: Any) -> list[str]:
    """Every string at any depth of a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


async def _paced(frames: list[str], step: Step) -> AsyncIterator[str]:
    for i, frame in enumerate(frames):
        if step.stall_s and i == step.stall_after:
            await asyncio.sleep(step.stall_s)
        if step.pace_s:
            await asyncio.sleep(step.pace_s)
        yield frame


def build_app(provider: Provider) -> Starlette:
    state = StubState()

    async def handle(request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        entry: dict[str, Any] = {"path": request.url.path, "at": time.monotonic(), "headers": headers, "body": body,
                                 "violations": []}
        state.requests.append(entry)
        try:
            provider.check_headers(headers)
            if not isinstance(body, dict):
                raise Rejected(400, "invalid_request_error", "the request body is not a JSON object")
            violations = provider.validate(body)
            if violations:
                raise Rejected(400, "invalid_request_error", "; ".join(violations))
        except Rejected as exc:
            entry["violations"].append(exc.message)
            entry["answered"] = {"status": exc.status, "error": exc.kind}
            return provider.error_response(exc.status, exc.kind, exc.message)
        step = state.next_step(raw.decode(errors="replace"), _strings(body))
        entry["step"] = step.raw
        if step.delay_s:
            await asyncio.sleep(step.delay_s)
        if step.error is not None:
            response = provider.scripted_error(step)
            entry["answered"] = {"status": response.status_code, "error": step.error}
            return response
        reported = None if step.no_usage and provider.name == "openai" else step.usage
        entry["answered"] = {"status": 200, "usage": reported, "stream": bool(body.get("stream"))}
        if body.get("stream"):
            return StreamingResponse(_paced(provider.stream(step, body), step), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        if step.stall_s:
            await asyncio.sleep(step.stall_s)
        return JSONResponse(provider.complete(step, body))

    async def script(request: Request) -> Response:
        payload = await request.json()
        steps = payload if isinstance(payload, list) else payload.get("steps", [])
        for raw in steps:
            Step.parse(raw, 0)  # a malformed step fails the test's script call, not a later request
            state.queue.append(raw)
        return JSONResponse({"queued": len(state.queue)})

    async def requests(request: Request) -> Response:
        return JSONResponse(state.requests)

    async def reset(request: Request) -> Response:
        state.queue.clear()
        state.requests.clear()
        return JSONResponse({"reset": True})

    async def health(request: Request) -> Response:
        return JSONResponse({"provider": provider.name})

    return Starlette(routes=[
        Route(provider.path, handle, methods=["POST"]),
        Route("/_script", script, methods=["POST"]),
        Route("/_requests", requests, methods=["GET"]),
        Route("/_reset", reset, methods=["POST"]),
        Route("/_health", health, methods=["GET"]),
    ])


def serve(make_provider: Callable[[], Provider]) -> None:
    """Run the stub on ``--port`` (0: a free port) of 127.0.0.1; print ``PORT <n>`` once bound."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    sys.stdout.flush()
    # A stalled answer still sleeping must not hold up the stub's exit.
    config = uvicorn.Config(build_app(make_provider()), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {payload}\n\n"
