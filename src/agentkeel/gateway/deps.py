"""The gateway's per-process state and the lookups every route shares.

``Gateway`` is what routes reach through ``Depends(gateway)``: the runtime, the ``gateway:``
settings, the process's counters (for ``/metrics``) and the background tasks the gateway owns
(cleaning up temporary threads, cancelling runs whose client went away); lookups of threads and
runs go through ``access.py``, which knows who is asking. Keeping the tasks here
means shutdown can wait for them instead of leaving a half-deleted thread behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from agentkeel.config import GatewayConfig
from agentkeel.gateway.metrics import Metrics
from agentkeel.runtime.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class Gateway:
    runtime: Runtime
    settings: GatewayConfig
    metrics: Metrics = field(default_factory=Metrics)
    draining: bool = False
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.metrics.bind(self.runtime, lambda: self.draining)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, keep a reference, and log (never lose) its failure."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("gateway task %s failed", task.get_name(), exc_info=task.exception())

    async def drain(self, drain_s: float | None = None) -> None:
        """Stop admitting runs, give running ones ``drain_s`` (default ``gateway.drain_s``),
        interrupt the rest (each finalized with its status and END), then let background work on
        them (temporary-thread cleanup) finish. Idempotent, and safe to call again with a shorter
        bound while a drain waits; the runtime's own close repeats the first step harmlessly."""
        self.draining = True
        await self.runtime.manager.shutdown(self.settings.drain_s if drain_s is None else drain_s)
        await self.settle()

    async def settle(self) -> None:
        """Wait (bounded) for the background tasks; a run they wait on must already be ending."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(self.settings.drain_s, 1.0))


async def gateway(request: Request) -> Gateway:
    """FastAPI dependency: the app's ``Gateway`` (set by ``create_app`` or its lifespan). A
    coroutine although it never awaits: FastAPI runs a plain-function dependency on a worker
    thread, a hand-off per request for an attribute read."""
    state: Gateway | None = getattr(request.app.state, "gateway", None)
    if state is None:
        raise RuntimeError("the gateway is not started (its lifespan did not run)")
    return state
