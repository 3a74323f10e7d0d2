"""The console timeline's rows (``gateway/console/timeline.py``) from journal records: placed in
time by their recorded latency and duration, subagents nested under the task call that started
them (also a subagent's own child), each child's calls under the child, compaction marked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentkeel.gateway.console.timeline import _model_point, _steps
from agentkeel.runtime.records import utcnow
from agentkeel.runtime.stores.base import JournalEvent

T0 = utcnow()


def _event(seq: int, at_ms: int, kind: str, caller: str, **data: Any) -> JournalEvent:
    return JournalEvent("r", "t", seq, kind, data, caller, T0 + timedelta(milliseconds=at_ms))


def _by_seq(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {row["seq"]: row for row in rows}


def test_rows_are_placed_in_time_and_nested_under_their_task_calls() -> None:
    events = [
        _event(1, 0, "run.start", "worker"),
        _event(2, 500, "model.call", "lead", model="m", input_tokens=100, output_tokens=10, latency_ms=400),
        _event(3, 510, "subagent.start", "subagent:research", task_id="call-a", subagent_type="research", depth=1),
        _event(4, 520, "subagent.start", "subagent:writer", task_id="call-b", subagent_type="writer", depth=1),
        _event(5, 900, "model.call", "subagent:research", model="m", input_tokens=50, output_tokens=5, latency_ms=300),
        _event(6, 950, "subagent.start", "subagent:checker", task_id="call-c", subagent_type="checker", depth=2),
        _event(7, 1000, "model.call", "subagent:checker", model="m", input_tokens=20, output_tokens=2, latency_ms=40),
        _event(8, 1010, "subagent.end", "subagent:checker", task_id="call-c", status="completed"),
        _event(9, 1020, "tool.call", "subagent:research", name="task", call_id="call-c", status="ok", duration_ms=80),
        _event(10, 1100, "model.call", "subagent:writer", model="m", input_tokens=60, output_tokens=6, latency_ms=500),
        _event(11, 1200, "subagent.end", "subagent:research", task_id="call-a", status="completed", stop_reason=None),
        _event(12, 1300, "subagent.end", "subagent:writer", task_id="call-b", status="failed", error="boom"),
        _event(13, 1310, "tool.call", "lead", name="task", call_id="call-a", status="ok", duration_ms=800),
        _event(14, 1320, "tool.call", "lead", name="task", call_id="call-b", status="error", duration_ms=810),
        _event(15, 1400, "model.call", "middleware:summarization", model="m", input_tokens=900, output_tokens=80, latency_ms=50),
        _event(16, 1500, "stop_reason", "TokenBudget", code="token_capped"),
    ]
    rows = _by_seq(_steps(events, T0))
    assert 1 not in rows and 8 not in rows  # run.start is not drawn; an end closes its start's row
    assert (rows[2]["start_ms"], rows[2]["end_ms"]) == (100.0, 500.0)
    assert (rows[13]["start_ms"], rows[13]["end_ms"]) == (510.0, 1310.0)
    research, writer, checker = rows[3], rows[4], rows[6]
    assert research["parent"] == rows[13]["id"] and writer["parent"] == rows[14]["id"]
    assert checker["parent"] == rows[9]["id"]  # a subagent's child, under the subagent's task call
    assert rows[9]["parent"] == research["id"]
    assert rows[5]["parent"] == research["id"] and rows[10]["parent"] == writer["id"] and rows[7]["parent"] == checker["id"]
    assert (research["end_ms"], research["status"]) == (1200.0, "completed")
    assert writer["status"] == "failed" and writer["detail"]["error"] == "boom"
    assert rows[14]["status"] == "error"
    assert rows[15]["label"].startswith("compaction summary") and rows[15]["parent"] is None
    assert rows[16]["kind"] == "stop_reason" and rows[16]["start_ms"] == rows[16]["end_ms"] == 1500.0
    assert _model_point(events[14], T0)["compaction"] is True and _model_point(events[1], T0)["compaction"] is False


def test_a_child_still_running_has_no_end() -> None:
    rows = _steps([_event(1, 10, "subagent.start", "subagent:research", task_id="call-a")], T0)
    assert rows[0]["status"] == "running" and rows[0]["end_ms"] is None and rows[0]["parent"] is None
