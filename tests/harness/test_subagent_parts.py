"""The subagent building blocks on their own: the FIFO capacity, outcomes as data, type resolution."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentkeel.config import ConfigError, SubagentsConfig, load_config
from agentkeel.harness.middleware.durable_context import result_update
from agentkeel.harness.middleware.keys import SUBAGENT_RESULT
from agentkeel.harness.subagents import Capacity, SubagentConfigError, SubagentOutcome, brief_of, resolve_types

TOOLS = ["read_file", "write_file", "str_replace", "ls", "glob", "grep", "ask_clarification"]


# -- capacity ----------------------------------------------------------------------------------


async def test_capacity_grants_slots_in_request_order() -> None:
    capacity = Capacity(1)
    order: list[int] = []
    release = asyncio.Event()

    async def worker(i: int) -> None:
        async with capacity.slot():
            order.append(i)
            if i == 0:
                await release.wait()

    tasks = [asyncio.create_task(worker(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert (capacity.running, capacity.waiting, order) == (1, 4, [0])
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert (capacity.running, capacity.waiting) == (0, 0)


async def test_a_cancelled_waiter_gives_up_its_place_and_no_slot_leaks() -> None:
    capacity = Capacity(1)
    hold = asyncio.Event()
    started: list[str] = []

    async def worker(name: str) -> None:
        async with capacity.slot():
            started.append(name)
            if name == "first":
                await hold.wait()

    first = asyncio.create_task(worker("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(worker("second"))
    third = asyncio.create_task(worker("third"))
    await asyncio.sleep(0.01)
    second.cancel()
    await asyncio.sleep(0)
    hold.set()
    await asyncio.gather(first, third)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert started == ["first", "third"]
    assert capacity.running == 0


@given(st.integers(1, 4), st.integers(1, 12))
def test_capacity_never_runs_more_than_its_limit(limit: int, jobs: int) -> None:
    async def main() -> int:
        capacity = Capacity(limit)
        peak = 0

        async def worker() -> None:
            nonlocal peak
            async with capacity.slot():
                peak = max(peak, capacity.running)
                await asyncio.sleep(0)

        await asyncio.gather(*(worker() for _ in range(jobs)))
        assert capacity.running == 0
        return peak

    assert asyncio.run(main()) == min(limit, jobs)


# -- outcomes --------------------------------------------------------------------------------


@given(st.text(max_size=5000), st.integers(20, 3000))
def test_brief_is_bounded_and_keeps_both_ends(text: str, limit: int) -> None:
    brief = brief_of(text, limit)
    assert len(brief) <= max(limit, 0) or brief == text
    if len(text) <= limit:
        assert brief == text
    else:
        assert len(brief) == limit
        head = (limit - 5) * 2 // 3
        assert brief.startswith(text[:head]) and brief.endswith(text[-(limit - 5 - head):])


def _capped(code: str = "loop_capped") -> dict[str, object]:
    return {"code": code, "class": "loop", "source": "LoopDetection", "seq": 7, "detail": "d", "data": {}}


def test_a_capped_child_with_an_answer_is_completed_with_its_reason() -> None:
    outcome = SubagentOutcome("t1", "general-purpose", "write A", "completed", result="Wrote A.",
                              stop_reasons=[_capped()])
    message = outcome.message()
    data = message.artifact[SUBAGENT_RESULT]
    assert message.status == "success"
    assert message.content.startswith("Task completed (capped: repeated tool-call loop)")
    assert "Wrote A." in message.content
    assert data["status"] == "completed" and data["stop_reason"] == "loop_capped"
    assert data["sha256"] == hashlib.sha256(b"Wrote A.").hexdigest()
    # The delegation ledger reads the same data, never the text.
    update = result_update(message)
    assert (update["status"], update.get("stop_reason")) == ("completed", "loop_capped")


@pytest.mark.parametrize("status", ["failed", "cancelled", "timed_out"])
def test_an_unfinished_child_reports_its_partial_result_and_an_error_status(status: str) -> None:
    outcome = SubagentOutcome("t9", "researcher", "d", status, result="half of it", error="boom")  # type: ignore[arg-type]
    message = outcome.message()
    assert message.status == "error"
    assert "Partial result:\nhalf of it" in message.content and "boom" in message.content
    assert result_update(message)["status"] == status


# -- types -----------------------------------------------------------------------------------


def test_general_purpose_always_exists_and_types_filter_tools() -> None:
    config = SubagentsConfig(types=[
        {"name": "reader", "tools": ["read_file", "grep", "task"], "max_turns": 7},
        {"name": "nester", "delegation_depth": 2, "disallowed_tools": []},
    ])
    types = resolve_types(config, TOOLS)
    assert list(types) == ["general-purpose", "reader", "nester"]
    general = types["general-purpose"]
    assert "ask_clarification" not in general.tools and "task" not in general.tools
    assert types["reader"].tools == ("read_file", "grep")  # task without depth: dropped
    assert types["reader"].max_turns == 7 and types["reader"].timeout_s == config.timeout_s
    assert "task" in types["nester"].tools and types["nester"].delegation_depth == 2


def test_an_unknown_tool_name_in_a_type_names_its_key() -> None:
    config = SubagentsConfig(types=[{"name": "x", "tools": ["read_file", "teleport"]}])
    with pytest.raises(SubagentConfigError, match=r"subagents\.types\.0\.tools: unknown tool name\(s\) teleport"):
        resolve_types(config, TOOLS)


@pytest.mark.parametrize("body, key", [
    ("subagents: {max_concurrent: 9}", "subagents.max_concurrent"),
    ("subagents: {max_per_run: 0}", "subagents.max_per_run"),
    ("subagents: {types: [{name: 'bad name'}]}", "subagents.types.0.name"),
    ("subagents: {types: [{name: a}, {name: a}]}", "subagents: types: duplicate"),
    ("subagents: {types: [{name: a, model: nope}]}", "subagents.types.0.model"),
    ("subagents: {types: [{name: a, max_turns: 0}]}", "subagents.types.0.max_turns"),
])
def test_bad_subagent_config_names_the_key(tmp_path, body: str, key: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "keel.yaml"
    path.write_text(body + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key in str(info.value)
