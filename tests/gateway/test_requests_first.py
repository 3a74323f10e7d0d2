"""A request holds the runtime's start gate while it is answered, and lets go once its response
starts (or its hold lapses): running runs step aside for it, never for longer."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from test_gateway_runs_support import client, fresh_mode, runtime  # noqa: F401

from agentkeel.runtime import start_gate
from agentkeel.runtime.runtime import Runtime


async def test_a_request_holds_the_gate_until_its_response_starts(
    runtime: Runtime, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(start_gate, "MAX_HOLD_S", 600.0)
    gate = runtime.manager.start_gate
    seen: list[int] = []
    create = runtime.store.create_thread

    async def observed(*args: Any, **kwargs: Any) -> Any:
        seen.append(gate.holders)
        return await create(*args, **kwargs)

    monkeypatch.setattr(runtime.store, "create_thread", observed)
    made = await client.post("/threads", json={})
    assert made.status_code == 200, made.text
    assert seen == [1]  # held while the thread was being created
    assert gate.holders == 0  # and let go once answered
    tid = made.json()["thread_id"]
    waited = await client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "lead", "input": {"messages": []}})
    assert waited.status_code == 200, waited.text
    refused = await client.post("/threads/not-a-uuid/runs/wait", json={"assistant_id": "lead"})
    assert refused.status_code in (404, 422), refused.text
    assert gate.holders == 0  # a run's admission and start, a /wait and a refusal leave nothing held
