"""Runs over HTTP: on a thread (``/threads/{thread_id}/runs...``) and stateless (``/runs...``).

Defaults are the LangGraph server's (``enqueue``, ``on_disconnect=continue``,
``if_not_exists=reject``, stream mode ``values``). Every run-creating answer carries
``Content-Location`` (the run) and, for streams and waits, ``Location`` (where to reconnect).

A waited-for result (``/wait``, ``/join``, ``cancel?wait=1``) is computed only after the run's END
marker, from the thread's checkpointed state; an error or timeout is answered as
``{"__error__": ...}``, never as the last checkpoint's values as if the run had succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Response

from agentkeel.gateway.access import Access, Caller
from agentkeel.gateway.deps import Gateway, gateway
from agentkeel.gateway.errors import BUSY_THREAD, NotFound
from agentkeel.gateway.input_limits import MAX_OFFSET
from agentkeel.gateway.schemas import RunCreate, RunsCancel, StatelessRunCreate
from agentkeel.gateway.sse import STREAM_ROUTE, event_stream, json_when_done, until_end
from agentkeel.gateway.threads_view import thread_view
from agentkeel.runtime.assistants import resolve_assistant
from agentkeel.runtime.bridge import LIVE
from agentkeel.runtime.children import run_children
from agentkeel.runtime.manager import CancelOutcome
from agentkeel.runtime.records import ConflictError, OnDisconnect, RunRecord, RunStatus
from agentkeel.runtime.requests import STREAM_MODES, RequestError
from agentkeel.runtime.serialization import to_jsonable
from agentkeel.runtime.threads import delete_thread

log = logging.getLogger(__name__)
router = APIRouter(tags=["runs"])
GW = Annotated[Gateway, Depends(gateway)]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]
StreamModes = Annotated[list[str] | None, Query()]
CancelAction = Literal["interrupt", "rollback"]

_RUN_FIELDS = (
    "run_id", "thread_id", "assistant_id", "metadata", "status", "kwargs", "multitask_strategy",
    "created_at", "updated_at", "attempt", "stop_reasons", "stop_reason", "usage", "error", "error_detail",
)


def run_json(record: RunRecord) -> dict[str, Any]:
    """The Run resource: LangGraph's fields plus AgentKeel's ``stop_reasons``, ``stop_reason``,
    ``usage``, ``attempt`` and ``error``. Owner and lease stay internal."""
    fields = record.to_dict()
    return {key: fields[key] for key in _RUN_FIELDS}


async def run_detail_json(gw: Gateway, record: RunRecord) -> dict[str, Any]:
    """The Run resource of a single-run GET: :func:`run_json` plus ``subagents``, the run's
    children from its journal (``runtime/children.py``). Lists and other answers leave it out, so
    they stay one store query however many runs they hold."""
    return {**run_json(record), "subagents": await run_children(gw.runtime.journal, record)}


def _run_path(record: RunRecord, stateless: bool = False) -> str:
    return f"/runs/{record.run_id}" if stateless else f"/threads/{record.thread_id}/runs/{record.run_id}"


# -- admission -------------------------------------------------------------------------------------
async def _admit(gw: Gateway, access: Access, body: RunCreate, thread_id: str, *, must_exist: bool) -> RunRecord:
    store = gw.runtime.store
    value: dict[str, Any] = {"thread_id": thread_id, "assistant_id": body.assistant_id, "metadata": dict(body.metadata or {}),
             "multitask_strategy": body.multitask_strategy, "if_not_exists": body.if_not_exists,
             "after_seconds": body.after_seconds}
    found = await access.authorize("threads", "create_run", value)  # may change value["metadata"]
    assistant = await resolve_assistant(gw.runtime, body.assistant_id, access.sees_assistant)
    existing = await store.get_thread(thread_id)
    if existing is not None and not access.sees(existing.metadata, found):
        raise NotFound("Thread or assistant not found.")  # another user's, whatever if_not_exists says
    if existing is None and must_exist and body.if_not_exists == "reject":
        raise NotFound("Thread or assistant not found.")
    request = body.to_request(thread_id, assistant, access.user_id)
    request.metadata = value["metadata"]
    # As on the LangGraph server: a thread remembers what last ran on it, which is how chat UIs
    # list "my threads" (threads.search(metadata={"graph_id": ...})). Stamped by the admission's
    # own transaction: only if the run is admitted, and never on a thread deleted meanwhile.
    request.thread_metadata = {"graph_id": assistant.graph_id, "assistant_id": assistant.assistant_id}
    assert request.config is not None  # to_request always builds one
    request.config["configurable"].update(access.configurable())
    if body.strict_resume and "resume" in (body.command or {}):
        await _require_waiting_interrupt(gw, thread_id)
    # Without users, admission creates a missing thread itself, atomically with the run. With
    # users the thread must be its creator's from its first moment, so it is created first (of
    # racing creators one wins; the others find someone's thread) and removed again, if still
    # empty, when admission refuses the run.
    created = existing is None and access.identity is not None and await _create_owned(access, thread_id, found)
    began = time.perf_counter()
    try:
        record = await gw.runtime.manager.create(request)
    except BaseException as exc:
        if created and not await store.list_runs(thread_id, limit=1):
            await store.delete_thread(thread_id)
        if isinstance(exc, ConflictError):
            raise ConflictError(BUSY_THREAD) from None
        raise
    gw.metrics.admitted(time.perf_counter() - began)
    return record


async def _create_owned(access: Access, thread_id: str, found: dict[str, Any] | None) -> bool:
    """Create the caller's thread; False when it exists meanwhile (and is the caller's)."""
    store = access.runtime.store
    if await store.create_thread(thread_id, access.owned({})) is not None:
        return True
    raced = await store.get_thread(thread_id)
    if raced is None or not access.sees(raced.metadata, found):
        raise NotFound("Thread or assistant not found.")
    return False


async def _require_waiting_interrupt(gw: Gateway, thread_id: str) -> None:
    """``strict_resume``: a resume must answer an interrupt the thread is waiting on now (not one
    already answered by another tab, or one a queued run has yet to raise)."""
    thread = await gw.runtime.store.get_thread(thread_id)
    if thread is None or not (await thread_view(gw.runtime, thread))["interrupts"]:
        raise ConflictError(f"strict_resume: thread {thread_id} has no interrupt waiting for a resume")


async def _admit_stateless(gw: Gateway, access: Access, body: StatelessRunCreate) -> tuple[RunRecord, asyncio.Task[Any] | None]:
    """Admit on the named thread or a new one; with ``on_completion=delete`` also start the task
    that, after END, reads the result and deletes the thread (only one this call created)."""
    named = ((body.config or {}).get("configurable") or {}).get("thread_id")
    thread_id = str(named) if named else str(uuid.uuid4())
    created = not named or await gw.runtime.store.get_thread(thread_id) is None
    if created and body.command is not None and "resume" in body.command:
        raise RequestError("command", "You must provide a thread_id when resuming.", "not_allowed")
    record = await _admit(gw, access, body, thread_id, must_exist=False)
    cleanup = None
    if created and body.on_completion == "delete":
        cleanup = gw.spawn(_result_then_delete(gw, record), name=f"agentkeel-temporary-{record.run_id}")
    return record, cleanup


# -- results ---------------------------------------------------------------------------------------
def _error_of(record: RunRecord) -> dict[str, str]:
    message = record.error or f"the run ended with status {record.status.value}"
    if record.status is RunStatus.timeout:
        return {"error": "TimeoutError", "message": message}
    name, sep, rest = message.partition(": ")
    return {"error": name, "message": rest} if sep and name.isidentifier() else {"error": "Error", "message": message}


async def final_result(gw: Gateway, run_id: str) -> Any:
    """What ``/wait`` answers once the run has ended (see the module docstring)."""
    record = await gw.runtime.store.get(run_id)
    if record is None:
        return {"__error__": {"error": "RunDeleted", "message": f"run {run_id} was rolled back or deleted"}}
    if not record.status.terminal:  # never the last checkpoint's values as if it had finished
        return {"__error__": {"error": "RunNotFinished",
                              "message": f"run {run_id} is still {record.status.value}"}}
    if record.status in (RunStatus.error, RunStatus.timeout):
        return {"__error__": _error_of(record)}
    snapshot = await (await gw.runtime.accessor(record.assistant_id)).aget(record.thread_id)
    if snapshot is None:
        return {}
    values = to_jsonable(snapshot.values)
    if snapshot.interrupts and isinstance(values, dict):
        values["__interrupt__"] = to_jsonable(list(snapshot.interrupts))
    return values


async def _result_after_end(gw: Gateway, run_id: str) -> Any:
    await until_end(gw, run_id)
    return await final_result(gw, run_id)


async def _result_then_delete(gw: Gateway, record: RunRecord) -> Any:
    """A temporary thread leaves nothing behind: runs and journal, checkpoints, workspace."""
    try:
        return await _result_after_end(gw, record.run_id)
    finally:
        try:
            await delete_thread(gw.runtime, record.thread_id)
        except Exception:  # the result stands; the leftover thread is reported, not hidden
            log.exception("deleting temporary thread %s failed", record.thread_id)


async def _shielded(task: asyncio.Task[Any]) -> Any:
    """Await a task owned elsewhere without cancelling it when the waiter is cancelled."""
    return await asyncio.shield(task)


def _modes(requested: list[str] | None, record: RunRecord) -> list[str]:
    """A join's modes: the requested ones (every repeated ``stream_mode``), else the run's own."""
    modes = [m for m in requested or [] if m]
    unknown = sorted(set(modes) - STREAM_MODES)
    if unknown:
        raise RequestError("stream_mode", f"unknown mode(s) {unknown}; known: {sorted(STREAM_MODES)}")
    return modes or list(record.kwargs.get("stream_mode") or ["values"])


# -- responses shared by thread and stateless routes ----------------------------------------------
def _stream_new(gw: Gateway, record: RunRecord, body: RunCreate, path: str) -> Response:
    """A new run's whole stream, from its first event."""
    return event_stream(
        gw, record.run_id, modes=record.kwargs["stream_mode"], last_event_id=None,
        cancel_on_disconnect=body.on_disconnect is OnDisconnect.cancel,
        headers={"Location": f"{path}/stream", "Content-Location": path},
    )


def _wait_new(gw: Gateway, record: RunRecord, body: RunCreate, path: str, result: Awaitable[Any]) -> Response:
    return json_when_done(
        gw, result, cancel_run_id=record.run_id if body.on_disconnect is OnDisconnect.cancel else None,
        headers={"Location": f"{path}/join", "Content-Location": path},
    )


def _join(gw: Gateway, record: RunRecord, path: str, cancel_on_disconnect: bool) -> Response:
    gw.runtime.bridge.check_capacity()
    return json_when_done(
        gw, _result_after_end(gw, record.run_id),
        cancel_run_id=record.run_id if cancel_on_disconnect else None,
        headers={"Location": f"{path}/join"},
    )


def _join_stream(
    gw: Gateway, record: RunRecord, stream_mode: list[str] | None, cancel_on_disconnect: bool,
    last_event_id: str | None,
) -> Response:
    """Without ``Last-Event-ID`` a join gets only what is published after it joined."""
    return event_stream(
        gw, record.run_id, modes=_modes(stream_mode, record), last_event_id=last_event_id or LIVE,
        cancel_on_disconnect=cancel_on_disconnect,
    )


# -- thread runs -----------------------------------------------------------------------------------
@router.post("/threads/{thread_id}/runs")
async def create_run(thread_id: str, body: RunCreate, gw: GW, access: Caller, response: Response) -> dict[str, Any]:
    record = await _admit(gw, access, body, thread_id, must_exist=True)
    response.headers["Content-Location"] = _run_path(record)
    return run_json(record)


@router.post("/threads/{thread_id}/runs/stream", **STREAM_ROUTE)
async def stream_run(thread_id: str, body: RunCreate, gw: GW, access: Caller) -> Response:
    gw.runtime.bridge.check_capacity()  # refuse before admitting a run nobody could follow
    record = await _admit(gw, access, body, thread_id, must_exist=True)
    return _stream_new(gw, record, body, _run_path(record))


@router.post("/threads/{thread_id}/runs/wait")
async def wait_run(thread_id: str, body: RunCreate, gw: GW, access: Caller) -> Response:
    gw.runtime.bridge.check_capacity()  # refuse before admitting a run nobody could follow
    record = await _admit(gw, access, body, thread_id, must_exist=True)
    return _wait_new(gw, record, body, _run_path(record), _result_after_end(gw, record.run_id))


@router.get("/threads/{thread_id}/runs")
async def list_runs(
    thread_id: str,
    gw: GW,
    access: Caller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    status: RunStatus | None = None,
    select: Annotated[list[str] | None, Query()] = None,
) -> list[dict[str, Any]]:
    await access.thread(thread_id)
    records = await gw.runtime.store.list_runs(
        thread_id, statuses=[status] if status else None, limit=limit, offset=offset
    )
    runs = [run_json(r) for r in records]
    return [{k: v for k, v in run.items() if k in select} for run in runs] if select else runs


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get_run(thread_id: str, run_id: str, gw: GW, access: Caller) -> dict[str, Any]:
    return await run_detail_json(gw, await access.run(run_id, thread_id))


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
async def delete_run(thread_id: str, run_id: str, gw: GW, access: Caller) -> Response:
    await access.run(run_id, thread_id, "delete")
    if not await gw.runtime.manager.delete_run(run_id):  # raises ConflictError while active
        raise NotFound(f"Run {run_id} not found")
    return Response(status_code=204)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", responses={202: {"description": "Cancellation requested (wait=false)"}})
async def cancel_run(
    thread_id: str,
    run_id: str,
    gw: GW,
    access: Caller,
    wait: bool = False,
    action: CancelAction = "interrupt",
    reason: str | None = None,
) -> Response:
    record = await access.run(run_id, thread_id, "update")
    outcome = await gw.runtime.manager.cancel(
        run_id, action, source="gateway", detail=reason or "cancelled by request"
    )
    if outcome is CancelOutcome.not_found:
        raise NotFound(f"Run {run_id} not found")
    if outcome is CancelOutcome.already_finished:
        raise ConflictError(f"Run {run_id} already finished (status {record.status.value}); nothing to cancel")
    if not wait:
        return Response(status_code=202)
    path = _run_path(record)
    return json_when_done(gw, _result_after_end(gw, run_id), headers={"Location": f"{path}/join"})


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join_run(thread_id: str, run_id: str, gw: GW, access: Caller, cancel_on_disconnect: bool = False) -> Response:
    record = await access.run(run_id, thread_id)
    return _join(gw, record, _run_path(record), cancel_on_disconnect)


@router.get("/threads/{thread_id}/runs/{run_id}/stream", **STREAM_ROUTE)
@router.post("/threads/{thread_id}/runs/{run_id}/stream", **STREAM_ROUTE)
async def join_stream(
    thread_id: str,
    run_id: str,
    gw: GW,
    access: Caller,
    stream_mode: StreamModes = None,
    cancel_on_disconnect: bool = False,
    last_event_id: LastEventId = None,
) -> Response:
    record = await access.run(run_id, thread_id)
    return _join_stream(gw, record, stream_mode, cancel_on_disconnect, last_event_id)


@router.get("/threads/{thread_id}/runs/{run_id}/journal")
async def run_journal(
    thread_id: str,
    run_id: str,
    gw: GW,
    access: Caller,
    after_seq: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
    kind: Annotated[list[str] | None, Query()] = None,
) -> list[dict[str, Any]]:
    """AgentKeel: the run's journal in ``seq`` order (``kind`` filters; repeat it for several)."""
    await access.run(run_id, thread_id)
    events = await gw.runtime.journal.list(run_id, after_seq=after_seq, limit=limit, kinds=kind or None)
    return [event.to_dict() for event in events]


@router.get("/threads/{thread_id}/runs/{run_id}/changes")
async def run_changes(thread_id: str, run_id: str, gw: GW, access: Caller) -> list[dict[str, Any]]:
    """AgentKeel: files the run changed, each with the tool call and journal seq that changed it."""
    await access.run(run_id, thread_id)
    events = await gw.runtime.journal.list(run_id, kinds=["file.changed"])
    return [{**event.data, "seq": event.seq} for event in events]


# -- stateless runs --------------------------------------------------------------------------------
@router.post("/runs")
async def create_stateless_run(body: StatelessRunCreate, gw: GW, access: Caller, response: Response) -> dict[str, Any]:
    record, _cleanup = await _admit_stateless(gw, access, body)
    response.headers["Content-Location"] = _run_path(record, stateless=True)
    return run_json(record)


@router.post("/runs/stream", **STREAM_ROUTE)
async def stream_stateless_run(body: StatelessRunCreate, gw: GW, access: Caller) -> Response:
    gw.runtime.bridge.check_capacity()  # refuse before admitting a run nobody could follow
    record, _cleanup = await _admit_stateless(gw, access, body)
    return _stream_new(gw, record, body, _run_path(record, stateless=True))


@router.post("/runs/wait")
async def wait_stateless_run(body: StatelessRunCreate, gw: GW, access: Caller) -> Response:
    gw.runtime.bridge.check_capacity()  # refuse before admitting a run nobody could follow
    record, cleanup = await _admit_stateless(gw, access, body)
    result = _shielded(cleanup) if cleanup is not None else _result_after_end(gw, record.run_id)
    return _wait_new(gw, record, body, _run_path(record, stateless=True), result)


@router.post("/runs/cancel", status_code=204)
async def cancel_runs(body: RunsCancel, gw: GW, access: Caller, action: CancelAction = "interrupt") -> Response:
    """Cancel several runs: ``{thread_id[, run_ids]}``, ``{run_ids}`` or ``{status}``, of those
    the caller may see. 404 when nothing was cancelled."""
    if body.status is not None and (body.thread_id or body.run_ids):
        raise RequestError("status", "give either status or thread_id/run_ids, not both")
    store = gw.runtime.store
    if body.status is not None:
        statuses = [RunStatus.pending, RunStatus.running] if body.status == "all" else [RunStatus(body.status)]
        visible = access.run_filter("update")
        run_ids = [r.run_id for r in await _all_runs(gw, statuses) if await visible(r)]
    elif body.run_ids:
        run_ids = [r for r in body.run_ids if await _belongs(access, r, body.thread_id)]
    elif body.thread_id:
        await access.thread(body.thread_id, "update")
        run_ids = [r.run_id for r in await store.active_runs(body.thread_id)]
    else:
        raise RequestError("thread_id", "give thread_id (and optionally run_ids), run_ids, or status")
    cancelled = 0
    for run_id in run_ids:
        outcome = await gw.runtime.manager.cancel(run_id, action, source="gateway", detail="cancelled by request")
        cancelled += outcome is CancelOutcome.cancelled
    if not cancelled:
        raise NotFound("No matching runs to cancel.")
    return Response(status_code=204)


async def _belongs(access: Access, run_id: str, thread_id: str | None) -> bool:
    try:
        await access.run(run_id, thread_id, "update")
    except NotFound:
        return False
    return True


async def _all_runs(gw: Gateway, statuses: list[RunStatus], page: int = 500) -> list[RunRecord]:
    """Every run in ``statuses``, collected before any is cancelled (cancelling moves them)."""
    found: list[RunRecord] = []
    while True:
        batch = await gw.runtime.store.list_runs(statuses=statuses, limit=page, offset=len(found))
        found.extend(batch)
        if len(batch) < page:
            return found


@router.get("/runs/{run_id}")
async def get_stateless_run(run_id: str, gw: GW, access: Caller) -> dict[str, Any]:
    return await run_detail_json(gw, await access.run(run_id))


@router.get("/runs/{run_id}/join")
async def join_stateless_run(run_id: str, gw: GW, access: Caller, cancel_on_disconnect: bool = False) -> Response:
    record = await access.run(run_id)
    return _join(gw, record, _run_path(record, stateless=True), cancel_on_disconnect)


@router.get("/runs/{run_id}/stream", **STREAM_ROUTE)
@router.post("/runs/{run_id}/stream", **STREAM_ROUTE)
async def join_stateless_stream(
    run_id: str,
    gw: GW,
    access: Caller,
    stream_mode: StreamModes = None,
    cancel_on_disconnect: bool = False,
    last_event_id: LastEventId = None,
) -> Response:
    record = await access.run(run_id)
    return _join_stream(gw, record, stream_mode, cancel_on_disconnect, last_event_id)
