"""The thread join stream (``GET /threads/{thread_id}/stream``): one SSE subscription to every
current and future run of a thread, each run's frames in turn, then ``metadata
{"status": "run_done", "run_id": ...}`` when it ends.

Why ids are ``"<run_id>:<event id>"``: a run's event ids ("N-0") restart at 1 per run, so on a
thread they are ambiguous; naming the run makes every id unique and resumable. ``Last-Event-ID`` in
that form replays the rest of that run, then every later run of the thread in full. The bare
aliases ``-1``, ``-``, ``0``, ``0-0`` replay the runs active at join time from their start, ``$`` (or
no header) gives only what is published after joining. Anything else is refused (422) up front.

Why runs are found with ``list_runs`` and a ``created_at`` cutoff rather than ``active_runs`` alone: a
short run can be admitted and finish between two checks, and ``active_runs`` would never show it.
Checks happen after each run ends and whenever the bridge announces a run admitted on the thread
(``StreamBridge.watch_thread``; the manager announces every admission): an idle thread stream
makes no database query, and a lost announcement costs at most ``_RECHECK_S`` of latency. The
stream closes only when the client leaves (never cancelling a run) or the gateway drains (checked
every ``_DRAIN_CHECK_S``, so shutdown is not held up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent

from agentkeel.gateway.access import Caller
from agentkeel.gateway.deps import Gateway, gateway
from agentkeel.gateway.render import ModeRenderer
from agentkeel.gateway.sse import STREAM_ROUTE, follow_run, frame_data, rendered_frames, sse_frame
from agentkeel.runtime.bridge import LIVE, EventKind, InvalidEventId, ThreadWatch, parse_event_id
from agentkeel.runtime.observe import RUN_RECORD_EVENT
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.requests import RequestError

# sse's private helpers are reused on purpose: thread and run streams share framing, ids, counters.
log = logging.getLogger(__name__)
router = APIRouter(tags=["threads"])

THREAD_MODES = ("run_modes", "lifecycle", "state_update")
_FROM_START = frozenset({"-1", "-", "0", "0-0"})
_RECHECK_S = 30.0  # the store is checked this often while idle even without an announcement
_DRAIN_CHECK_S = 1.0  # how soon an idle stream notices the gateway draining
_PAGE = 100  # runs read per check: more admitted between two checks than this are not followed
Modes = Annotated[list[str] | None, Query()]


class _CursorRefused(Exception):
    """The ``Last-Event-ID`` is beyond its run's stream (an error event was sent)."""


def _thread_modes(stream_mode: list[str] | None, stream_modes: list[str] | None) -> set[str]:
    """Both spellings (SDKs send ``stream_mode``, the official server reads ``stream_modes``)."""
    modes = {m.strip() for raw in [*(stream_mode or []), *(stream_modes or [])] for m in raw.split(",")} - {""}
    unknown = sorted(modes - set(THREAD_MODES))
    if unknown:
        raise RequestError("stream_mode", f"unknown thread stream mode(s) {unknown}; known: {list(THREAD_MODES)}")
    return modes or {"run_modes"}


def _split_cursor(last_event_id: str | None) -> tuple[str | None, str]:
    """``(run_id, event id)`` of a thread cursor; ``(None, alias)`` for the bare aliases."""
    if last_event_id is None or last_event_id in _FROM_START or last_event_id == LIVE:
        return None, last_event_id or LIVE
    run_id, sep, event_id = last_event_id.partition(":")
    if not sep or not run_id:
        raise InvalidEventId(f"malformed Last-Event-ID {last_event_id!r}: expected '<run_id>:<event id>'")
    parse_event_id(event_id)
    return run_id, event_id


@router.get("/threads/{thread_id}/stream", **STREAM_ROUTE)
async def thread_stream(
    thread_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    access: Caller,
    stream_mode: Modes = None,
    stream_modes: Modes = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    await access.thread(thread_id)
    gw.runtime.bridge.check_capacity()
    modes = _thread_modes(stream_mode, stream_modes)
    run_id, event_id = _split_cursor(last_event_id)
    store = gw.runtime.store
    seen: dict[str, datetime] = {}  # runs already followed or queued (pruned below the cutoff)
    queue: list[tuple[RunRecord, str | None]]
    if run_id is not None and (cursor_run := await store.get(run_id)) is not None:
        if cursor_run.thread_id != thread_id:
            raise InvalidEventId(f"Last-Event-ID names run {run_id}, which is not a run of thread {thread_id}")
        queue = [(cursor_run, event_id)]
        cutoff: datetime | None = cursor_run.created_at
    else:  # no cursor, an alias, or a run deleted since (rollback): replaying the active runs
        replay = run_id is not None or event_id in _FROM_START  # whole, so nothing is missed
        newest = await store.list_runs(thread_id, limit=1)
        cutoff = newest[0].created_at if newest else None
        seen.update((r.run_id, r.created_at) for r in newest)
        queue = [
            (r, None if replay or r.status is RunStatus.pending else LIVE)
            for r in await store.active_runs(thread_id)
        ]
    seen.update((r.run_id, r.created_at) for r, _ in queue)
    return EventSourceResponse(
        _frames(gw, thread_id, modes, queue, cutoff, seen),
        ping=min(gw.settings.heartbeat_s, 5.0),
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
    )


async def _frames(
    gw: Gateway, thread_id: str, modes: set[str], queue: list[tuple[RunRecord, str | None]],
    cutoff: datetime | None, seen: dict[str, datetime],
) -> AsyncIterator[bytes]:
    """Follow the queued runs one by one, then each run admitted after ``cutoff``, until the client
    leaves (a cancellation here; observers are closed, runs are left alone). The watch is opened
    before the first check, so a run admitted at any point after it is announced to it."""
    gw.metrics.streams_open += 1
    try:
        async with gw.runtime.bridge.watch_thread(thread_id) as watch:
            while True:
                for record, cursor in queue:
                    async for frame in _run_frames(gw, record, modes, cursor):
                        yield frame
                    cutoff = record.created_at if cutoff is None else max(cutoff, record.created_at)
                if gw.draining:  # no new runs will come; an endless stream would hold up shutdown
                    return
                queue = [(r, None) for r in await _newer(gw, thread_id, cutoff, seen)]
                if not queue:
                    await _idle(gw, watch)
    except _CursorRefused:  # its error event was sent: the client must pick another cursor
        return
    except Exception as exc:
        log.exception("thread %s: thread stream failed", thread_id)
        yield sse_frame("error", {"error": type(exc).__name__, "message": "the thread stream failed; reconnect with Last-Event-ID"})
    finally:
        gw.metrics.streams_open -= 1


async def _idle(gw: Gateway, watch: ThreadWatch) -> None:
    """Until a run is announced on the thread, the gateway drains, or ``_RECHECK_S`` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _RECHECK_S
    while not gw.draining and (left := deadline - loop.time()) > 0:
        if await watch.wait(min(_DRAIN_CHECK_S, left)):
            return


async def _newer(gw: Gateway, thread_id: str, cutoff: datetime | None, seen: dict[str, datetime]) -> list[RunRecord]:
    """Runs of the thread admitted at or after ``cutoff`` and not followed yet, oldest first."""
    records = await gw.runtime.store.list_runs(thread_id, limit=_PAGE)
    fresh = [r for r in reversed(records) if r.run_id not in seen and (cutoff is None or r.created_at >= cutoff)]
    seen.update((r.run_id, r.created_at) for r in fresh)
    if cutoff is not None:  # ids older than the cutoff can never match again
        for run_id in [k for k, created in seen.items() if created < cutoff]:
            del seen[run_id]
    return fresh


async def _run_frames(gw: Gateway, record: RunRecord, modes: set[str], cursor: str | None) -> AsyncIterator[bytes]:
    """One run's frames after ``cursor``, then its ``run_done``.

    ``run_modes`` renders each run for its own ``stream_mode``; otherwise only ``metadata`` (start
    and done: every mode gets them) and, with ``state_update``, ``values`` events pass.
    """
    run_id = record.run_id
    whole = "run_modes" in modes
    renderer = ModeRenderer(list(record.kwargs.get("stream_mode") or ["values"]) if whole else ["values"])
    kept = None if whole else {"metadata"} | ({"values"} if "state_update" in modes else set())
    items = follow_run(gw, run_id, cursor)
    async with contextlib.aclosing(items):
        async for item in items:
            if item.kind is EventKind.data and item.event == RUN_RECORD_EVENT:
                if whole and cursor != LIVE:  # the stream was reaped: the durable record instead
                    yield sse_frame(RUN_RECORD_EVENT, item.data)
            elif item.kind in (EventKind.data, EventKind.gap):
                frames = _kept(renderer.feed(item.event, frame_data(renderer, item)), kept)
                for frame in rendered_frames(gw, frames, f"{run_id}:{item.id}" if item.id else None, renderer.holding):
                    yield frame
            elif item.kind is EventKind.error:
                yield sse_frame("error", item.data)
                raise _CursorRefused
            elif item.kind is EventKind.end:
                for frame in rendered_frames(gw, _kept(renderer.flush(), kept), None, False):
                    yield frame
                break
    yield sse_frame("metadata", {"status": "run_done", "run_id": run_id})


def _kept(frames: list[tuple[str, Any]], kept: set[str] | None) -> list[tuple[str, Any]]:
    return frames if kept is None else [(n, d) for n, d in frames if n.partition("|")[0] in kept]
