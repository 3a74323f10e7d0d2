"""Multitask strategies, cancellation and run deletion through the official SDK.

A "slow" run is ``echo`` looping with a short sleep per superstep, so it has written checkpoints
(and is still running) when the second request arrives.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError
from server_support import collect, run_reaches, slow_input, wait_until

SLOW = slow_input(steps=60, delay=0.05)


async def _slow_run(client: Any, tid: str | None = None, **kwargs: Any) -> tuple[str, str]:
    """A slow run that has completed at least two supersteps."""
    tid = tid or (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "echo", input=SLOW, **kwargs)
    await _progressed(client, tid, 2)
    return tid, run["run_id"]


async def _progressed(client: Any, tid: str, done: int) -> None:
    async def reached() -> bool:
        values = (await client.threads.get_state(tid))["values"] or {}
        return values.get("done", 0) >= done

    await wait_until(reached)


async def _run_ids_in_history(client: Any, tid: str) -> list[str]:
    """Run ids of the checkpoints the thread's head descends from, oldest first, each once.

    The head's lineage, not the whole history: AgentKeel's rollback forks the pre-run checkpoint
    into a new head and keeps the abandoned run's checkpoints beside it as an audit trail.
    """
    history = {s["checkpoint"]["checkpoint_id"]: s for s in await client.threads.get_history(tid, limit=1000)}
    head = (await client.threads.get_state(tid))["checkpoint"]["checkpoint_id"]
    order: list[str] = []
    while head is not None:
        state = history[head]
        run_id = state["metadata"].get("run_id")
        if run_id and run_id not in order:
            order.insert(0, run_id)
        head = (state.get("parent_checkpoint") or {}).get("checkpoint_id")
    return order


async def _deleted(client: Any, tid: str, run_id: str) -> None:
    async def gone() -> bool:
        try:
            await client.runs.get(tid, run_id)
        except NotFoundError:
            return True
        return False

    await wait_until(gone)


async def _status_code(call: Any) -> int:
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await call
    return caught.value.response.status_code


# -- multitask strategies --------------------------------------------------------------------------
async def test_reject(client: Any) -> None:
    tid, first = await _slow_run(client)
    with pytest.raises(ConflictError):
        await client.runs.create(tid, "echo", input={}, multitask_strategy="reject")
    assert await _status_code(collect(client.runs.stream(tid, "echo", input={}, multitask_strategy="reject"))) == 409
    assert await _status_code(client.runs.wait(tid, "echo", input={}, multitask_strategy="reject")) == 409
    assert (await client.runs.get(tid, first))["status"] == "running"
    assert len(await client.runs.list(tid)) == 1
    await client.runs.cancel(tid, first, wait=True)


async def test_interrupt_keeps_the_old_runs_checkpoints(client: Any) -> None:
    tid, first = await _slow_run(client)
    result = await client.runs.wait(tid, "echo", input={"steps": 0}, multitask_strategy="interrupt")
    old = await client.runs.get(tid, first)
    assert old["status"] == "interrupted" and old["stop_reason"] == "interrupted_by_new_run"
    assert result["done"] >= 3  # continued from the interrupted run's checkpoints, plus one step
    assert await _run_ids_in_history(client, tid) == [first, (await client.runs.list(tid))[0]["run_id"]]


async def test_rollback_deletes_the_old_run_and_restores_the_state(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "echo", input={"steps": 1})
    before = await _run_ids_in_history(client, tid)
    _, first = await _slow_run(client, tid)
    await _progressed(client, tid, 3)
    result = await client.runs.wait(tid, "echo", input={"steps": 0}, multitask_strategy="rollback")
    with pytest.raises(NotFoundError):
        await client.runs.get(tid, first)
    assert result["done"] == 2  # the state before the rolled-back run (done=1), plus one step
    history = await _run_ids_in_history(client, tid)
    assert first not in history and history[: len(before)] == before


async def test_enqueue_runs_in_order(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.create(tid, "echo", input=slow_input(steps=10, delay=0.1))
    queued = [await client.runs.create(tid, "echo", input={"steps": 0}) for _ in range(2)]  # enqueue is the default
    assert (await client.runs.get(tid, queued[1]["run_id"]))["status"] == "pending"
    assert (await client.threads.get(tid))["status"] == "busy"
    await client.runs.join(tid, queued[1]["run_id"])
    ids = [first["run_id"], *(q["run_id"] for q in queued)]
    assert [(await client.runs.get(tid, r))["status"] for r in ids] == ["success"] * 3
    assert await _run_ids_in_history(client, tid) == ids
    assert [r["run_id"] for r in await client.runs.list(tid)] == ids[::-1]  # newest first
    assert (await client.threads.get(tid))["status"] == "idle"


# -- cancel ----------------------------------------------------------------------------------------
async def test_cancel_interrupt_without_and_with_wait(client: Any) -> None:
    tid, run_id = await _slow_run(client)
    assert await client.runs.cancel(tid, run_id) is None  # 202, returns at once
    run = await run_reaches(client, tid, run_id, "interrupted")
    assert run["stop_reason"] == "cancelled" and run["stop_reasons"][0]["code"] == "cancelled"
    thread = await client.threads.get(tid)
    assert thread["status"] in ("idle", "interrupted") and thread["values"]["done"] >= 2

    tid, run_id = await _slow_run(client)
    body = await client.runs.cancel(tid, run_id, wait=True)
    assert isinstance(body, dict) and body.get("done", 0) >= 2  # the /join body: the values it got to
    assert (await client.runs.get(tid, run_id))["status"] == "interrupted"


async def test_cancel_rollback_without_and_with_wait(client: Any) -> None:
    for wait in (False, True):
        tid = (await client.threads.create())["thread_id"]
        await client.runs.wait(tid, "echo", input={"steps": 1})
        _, run_id = await _slow_run(client, tid)
        await client.runs.cancel(tid, run_id, action="rollback", wait=wait)
        await _deleted(client, tid, run_id)
        state = await client.threads.get_state(tid)
        assert state["values"]["done"] == 1, wait  # back to the state before the cancelled run
        assert (await client.threads.get(tid))["status"] == "idle"


async def test_cancel_a_queued_run_and_cancel_many(client: Any) -> None:
    tid, first = await _slow_run(client)
    queued = await client.runs.create(tid, "echo", input={})
    await client.runs.cancel(tid, queued["run_id"])
    assert (await run_reaches(client, tid, queued["run_id"], "interrupted"))["stop_reason"] == "cancelled"
    assert (await client.runs.get(tid, first))["status"] == "running"

    others = [await client.runs.create(tid, "echo", input={}) for _ in range(2)]
    await client.runs.cancel_many(thread_id=tid, run_ids=[others[0]["run_id"]])
    await run_reaches(client, tid, others[0]["run_id"], "interrupted")
    assert (await client.runs.get(tid, others[1]["run_id"]))["status"] == "pending"
    await client.runs.cancel_many(thread_id=tid)  # every active run of the thread
    for run_id in (first, others[1]["run_id"]):
        await run_reaches(client, tid, run_id, "interrupted")
    with pytest.raises(NotFoundError):
        await client.runs.cancel_many(thread_id=tid)  # nothing left to cancel


async def test_cancel_errors(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    with pytest.raises(NotFoundError):
        await client.runs.cancel(tid, str(uuid.uuid4()))
    done = await client.runs.create(tid, "echo", input={"steps": 1})
    await client.runs.join(tid, done["run_id"])
    # AgentKeel answers 409 for a run that already ended (the official server says 404)
    with pytest.raises(ConflictError):
        await client.runs.cancel(tid, done["run_id"])


async def test_delete_run(client: Any) -> None:
    tid, active = await _slow_run(client)
    with pytest.raises(ConflictError):
        await client.runs.delete(tid, active)
    await client.runs.cancel(tid, active, wait=True)
    await client.runs.delete(tid, active)
    with pytest.raises(NotFoundError):
        await client.runs.get(tid, active)
    with pytest.raises(NotFoundError):
        await client.runs.delete(tid, active)
