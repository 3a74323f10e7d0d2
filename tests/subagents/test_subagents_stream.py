"""Subagent progress on the run's stream, read with the official ``langgraph-sdk`` client from a
real ``keel serve`` process: ``task_started``, ``task_step`` and ``task_finished`` as ``custom``
events (``custom|<namespace>`` when the run streams subgraphs), and only when ``custom`` is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from runtime_support import call, turn
from server_support import KeelServer, collect, sdk, start_server
from subagent_support import GP, TOPICS, delegating_lead, runaway_child

TASK_EVENTS = ("task_started", "task_step", "task_finished")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    root = tmp_path_factory.mktemp("keel-subagents")
    agents = {"lead": delegating_lead(), GP: [turn("Looking.", call("ls", path="/workspace")), *runaway_child()]}
    (root / "script.yaml").write_text(yaml.safe_dump({"agents": agents}, sort_keys=False))
    config = {
        "data_dir": str(root / "data"), "database": f"sqlite:///{root / 'keel.db'}",
        "models": [{"name": "scripted", "use": "scripted", "script": "script.yaml"}],
        "limits": {"stream_heartbeat_s": 1},
        "gateway": {"heartbeat_s": 1, "drain_s": 2},
    }
    path = root / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    started = start_server(Path(path))
    yield started
    started.stop()


async def _stream(server: KeelServer, **kwargs: Any) -> list[Any]:
    async with sdk(server.url) as client:
        thread = await client.threads.create()
        return await collect(client.runs.stream(thread["thread_id"], "lead", input={
            "messages": [{"role": "user", "content": "Write three sentences, one per subagent."}]}, **kwargs), timeout=60)


def _task_events(parts: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p.event, p.data) for p in parts if p.event.split("|")[0] == "custom"
            and isinstance(p.data, dict) and p.data.get("type") in TASK_EVENTS]


def _check_lifecycle(events: list[tuple[str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Per task: started first, finished last, steps numbered from 1 in between."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for _, data in events:
        by_task.setdefault(data["task_id"], []).append(data)
    assert len(by_task) == len(TOPICS)
    for task_id, seen in by_task.items():
        kinds = [d["type"] for d in seen]
        assert kinds[0] == "task_started" and kinds[-1] == "task_finished" and kinds.count("task_finished") == 1
        steps = [d["step"] for d in seen if d["type"] == "task_step"]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2, (task_id, kinds)
        assert seen[0]["subagent_type"] == GP
        finished = seen[-1]
        assert (finished["status"], finished["stop_reason"]) == ("completed", "loop_capped")
        assert finished["usage"]["calls"] >= 1
    return by_task


async def test_custom_mode_carries_each_childs_lifecycle(server: KeelServer) -> None:
    parts = await _stream(server, stream_mode=["custom"])
    events = _task_events(parts)
    assert {name for name, _ in events} == {"custom"}
    by_task = _check_lifecycle(events)
    step = next(d for d in by_task[next(iter(by_task))] if d["type"] == "task_step")
    assert step["message"]["type"] == "ai" and step["message"]["tool_calls"][0]["name"] == "ls"


async def test_with_subgraphs_each_event_is_named_by_the_childs_namespace(server: KeelServer) -> None:
    parts = await _stream(server, stream_mode=["custom", "values"], stream_subgraphs=True)
    events = _task_events(parts)
    by_task = _check_lifecycle(events)
    for name, data in events:
        assert name.startswith("custom|"), name
    namespaces = {name for name, _ in events}
    assert len(namespaces) == len(by_task)  # one namespace per child
    started = {d["task_id"]: d["namespace"] for _, d in events if d["type"] == "task_started"}
    assert {f"custom|{ns}" for ns in started.values()} == namespaces


async def test_without_the_custom_mode_no_task_event_is_sent(server: KeelServer) -> None:
    parts = await _stream(server, stream_mode=["values"])
    assert _task_events(parts) == [] and not [p for p in parts if p.event.startswith("custom")]
