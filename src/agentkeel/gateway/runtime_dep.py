"""The FastAPI dependency through which the thread, assistant and store routes reach the runtime.

``create_app`` keeps the runtime inside its ``Gateway`` (``app.state.gateway.runtime``); an app
that needs nothing else may set ``app.state.runtime`` directly (the route tests do). These routes
use only the runtime, so they accept either and do not depend on how the app is composed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from agentkeel.runtime.runtime import Runtime


def app_runtime(request: Request) -> Runtime:
    state = request.app.state
    found = getattr(state, "runtime", None) or getattr(getattr(state, "gateway", None), "runtime", None)
    if found is None:
        raise RuntimeError("no runtime on app.state (neither app.state.runtime nor app.state.gateway)")
    return found


RuntimeDep = Annotated[Runtime, Depends(app_runtime)]
