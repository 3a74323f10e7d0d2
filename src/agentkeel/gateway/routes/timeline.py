"""``GET /threads/{thread_id}/runs/{run_id}/timeline``: a run's aligned timeline as JSON.

The same data ``keel replay`` draws (``runtime/timeline.py``): journal records, the run's
checkpoints and what its stream still retains on the journal's seq axis, subagents nested under
their task call, the attempts, and the divergence checks (``runtime/divergence.py``). Read-only;
the console and any client can render it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from agentkeel.gateway.access import Caller
from agentkeel.gateway.deps import Gateway, gateway
from agentkeel.gateway.errors import NotFound
from agentkeel.runtime.timeline import load_timeline

router = APIRouter(tags=["runs"])
GW = Annotated[Gateway, Depends(gateway)]


@router.get("/threads/{thread_id}/runs/{run_id}/timeline")
async def run_timeline(thread_id: str, run_id: str, gw: GW, access: Caller) -> dict[str, Any]:
    """AgentKeel: the run's aligned timeline (journal, checkpoints, stream) and its divergences."""
    await access.run(run_id, thread_id)  # 404 for a run of another thread, or another user's
    timeline = await load_timeline(gw.runtime, run_id)
    if timeline is None:  # deleted between the two reads
        raise NotFound(f"Run {run_id} not found")
    return timeline.to_dict()
