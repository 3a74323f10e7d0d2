"""Human-in-the-loop through the official SDK: ``interrupt()`` and ``command.resume``, and
``interrupt_before`` / ``interrupt_after`` with an ``input: null`` continue."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from server_support import LEAD_NOTE, QUESTION_TEXT, collect, events

from agentkeel.sandbox.workspace import Workspace

QUESTION = {"question": "approve?"}


async def test_interrupt_then_resume(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = await collect(client.runs.stream(tid, "hitl", input={"steps": 1}, stream_mode=["values", "updates"]))
    run_id = parts[0].data["run_id"]
    last_values = [p.data for p in parts if p.event == "values"][-1]
    (pending,) = last_values["__interrupt__"]
    assert pending["value"] == QUESTION and pending["id"]
    assert {"__interrupt__": [pending]} in [p.data for p in parts if p.event == "updates"]
    assert (await client.runs.get(tid, run_id))["status"] == "success"

    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"
    assert [i["value"] for group in thread["interrupts"].values() for i in group] == [QUESTION]
    state = await client.threads.get_state(tid)
    assert state["next"] == ["ask"] and state["tasks"][0]["interrupts"][0]["value"] == QUESTION

    resumed = await collect(client.runs.stream(tid, "hitl", command={"resume": "yes"}, stream_mode="updates"))
    assert events(resumed) == ["metadata", "updates", "updates"]
    assert resumed[1].data["ask"]["messages"][0]["content"] == "human said yes"
    thread = await client.threads.get(tid)
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    assert thread["values"]["done"] == 1


async def test_wait_reports_the_interrupt_and_resumes(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    body = await client.runs.wait(tid, "hitl", input={})
    assert [i["value"] for i in body["__interrupt__"]] == [QUESTION]
    final = await client.runs.wait(tid, "hitl", command={"resume": "no"})
    assert "__interrupt__" not in final
    assert final["messages"][-1]["content"] == "human said no"


@pytest.mark.parametrize("option", ["interrupt_before", "interrupt_after"])
async def test_interrupt_before_and_after_then_continue(client: Any, option: str) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = await collect(client.runs.stream(tid, "echo", input={"steps": 2}, stream_mode="updates", **{option: ["step"]}))
    assert parts[-1].data == {"__interrupt__": []}  # a static interrupt carries no value
    state = await client.threads.get_state(tid)
    assert state["next"] == ["step"]
    assert state["values"].get("done", 0) == (0 if option == "interrupt_before" else 1)
    final = await client.runs.wait(tid, "echo", input=None)  # continue from `next`
    assert final["done"] == 2
    assert (await client.threads.get(tid))["status"] == "idle"


@pytest.mark.parametrize("option", ["interrupt_before", "interrupt_after"])
async def test_thread_is_interrupted_while_a_static_interrupt_waits(client: Any, option: str) -> None:
    """The official server marks a thread ``interrupted`` whenever its head has ``next`` nodes."""
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "echo", input={"steps": 2}, **{option: ["step"]})
    assert (await client.threads.get_state(tid))["next"] == ["step"]
    assert (await client.threads.get(tid))["status"] == "interrupted"


async def test_resume_needs_a_thread(client: Any) -> None:
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await client.runs.wait(None, "hitl", command={"resume": "yes"})
    assert caught.value.response.status_code == 400


async def test_the_lead_asks_a_clarification_and_a_resume_answers_it(client: Any, keel_server: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    body = await client.runs.wait(
        tid, "lead", input={"messages": [{"role": "user", "content": "write a note"}]},
        context={"model_name": "asker"},
    )
    (pending,) = body["__interrupt__"]
    assert pending["value"]["question"] == QUESTION_TEXT and pending["value"]["options"] == ["team", "boss"]
    runs = await client.runs.list(tid)
    assert runs[0]["status"] == "success" and runs[0]["stop_reason"] == "clarification_requested"
    assert (await client.threads.get(tid))["status"] == "interrupted"
    note = Workspace.for_thread(keel_server.config.parent / "data", tid).real_root / LEAD_NOTE.removeprefix("/workspace/")
    assert not note.exists()  # the write that came with the question never ran

    final = await client.runs.wait(tid, "lead", command={"resume": "boss"}, context={"model_name": "answered"})
    assert "__interrupt__" not in final and final["messages"][-1]["content"] == "Done."
    assert note.read_text() == "for the boss\n"
    assert (await client.threads.get(tid))["status"] == "idle"
