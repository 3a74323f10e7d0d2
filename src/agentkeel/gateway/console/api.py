"""The console's data routes: runs across threads, and one run's timeline. Authenticated like the
rest of the API (they are not under the open ``/console/assets/``), and scoped to the caller.

Who sees what is decided by ``access.py``, as for every other route: a run belongs to its thread's
owner; an admin, and everyone while authentication is off, sees every run; the ``@auth.on`` rules
of ``auth.mode: langgraph`` apply as to a thread search (the list) and a thread read (the
timeline). Another user's run is a 404, as if it did not exist.

``GET /console/api/runs`` filters by status (in the store), then by assistant, primary stop reason
and a run-or-thread id fragment; it reads the store in pages until ``limit`` visible runs are found
or the runs run out, so a filter never shows a short page while more matches exist.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from agentkeel.gateway.access import Caller
from agentkeel.gateway.console.timeline import run_timeline
from agentkeel.gateway.deps import Gateway, gateway
from agentkeel.gateway.input_limits import MAX_OFFSET
from agentkeel.gateway.routes.runs import run_detail_json, run_json
from agentkeel.runtime.records import RunRecord, RunStatus

router = APIRouter(prefix="/console/api", tags=["console"])
GW = Annotated[Gateway, Depends(gateway)]
PAGE = 200  # store rows read per round while filling a page
MAX_SCANNED = 20_000  # a filter matching almost nothing stops here instead of reading every run
Text = Annotated[str | None, Query(max_length=200)]


def summary(record: RunRecord) -> dict[str, Any]:
    """A runs-list row: the Run resource plus what the list shows without another query."""
    usage = record.usage or {}
    duration = None
    if record.started_at is not None:
        duration = ((record.ended_at or record.updated_at) - record.started_at).total_seconds()
    return {**run_json(record), "started_at": record.started_at.isoformat() if record.started_at else None,
            "ended_at": record.ended_at.isoformat() if record.ended_at else None,
            "duration_s": duration, "total_tokens": int(usage.get("total_tokens") or 0)}


@router.get("/runs")
async def list_runs(
    gw: GW,
    access: Caller,
    status: RunStatus | None = None,
    assistant_id: Text = None,
    stop_reason: Text = None,
    q: Text = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[dict[str, Any]]:
    """Runs newest first, visible to the caller, filtered (``stop_reason=none``: runs without one)."""
    store = gw.runtime.store
    visible = access.run_filter("search", {"status": status.value if status else None, "limit": limit, "offset": offset})
    found: list[dict[str, Any]] = []
    skipped = scanned = 0
    while len(found) < limit and scanned < MAX_SCANNED:
        batch = await store.list_runs(statuses=[status] if status else None, limit=PAGE, offset=scanned)
        scanned += len(batch)
        for record in batch:
            if not _matches(record, assistant_id, stop_reason, q):
                continue
            if not await visible(record):
                continue
            if skipped < offset:
                skipped += 1
                continue
            found.append(summary(record))
            if len(found) == limit:
                break
        if len(batch) < PAGE:
            break
    return found


def _matches(record: RunRecord, assistant_id: str | None, stop_reason: str | None, q: str | None) -> bool:
    if assistant_id and record.assistant_id != assistant_id:
        return False
    if stop_reason and (record.stop_reason or "none") != stop_reason:
        return False
    return not q or q in record.run_id or q in record.thread_id


@router.get("/threads/{thread_id}/runs/{run_id}/timeline")
async def timeline(thread_id: str, run_id: str, gw: GW, access: Caller) -> dict[str, Any]:
    """The run page's document (``console/timeline.py``)."""
    record = await access.run(run_id, thread_id)
    return await run_timeline(gw.runtime, record, await run_detail_json(gw, record))
