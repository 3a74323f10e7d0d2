"""Unit checks of what a re-run takes from a recording: a recovered run's journal as it finished
(``runtime/finished_run.py``) and a raised tool's exception read from an older journal
(``runtime/tool_replay.py``). The end-to-end recordings, a real ``kill -9`` included, are in
``test_replay_recovered.py`` and ``test_tool_replay.py``."""

from __future__ import annotations

from typing import Any

from agentkeel.harness.middleware.tool_error_handling import exception_message
from agentkeel.runtime.finished_run import as_finished, recovered_calls
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.tool_replay import _raised


def event(seq: int, attempt: int, step: int | None, kind: str, caller: str = "lead", **data: Any) -> JournalEvent:
    return JournalEvent("r1", "t1", seq, kind, data, caller, attempt=attempt, step=step)


def test_a_lost_attempt_keeps_what_the_next_one_did_not_do_again() -> None:
    events = [
        event(1, 1, None, "run.start", "worker"),
        event(2, 1, 1, "model.call"),  # step 1 completed: kept
        event(3, 1, 2, "tool.intent", call_id="a"),  # finished with its pending write: not run again, kept
        event(4, 1, 2, "tool.call", call_id="a"),
        event(5, 1, 2, "tool.intent", call_id="b"),  # in flight: answered by the recovery
        event(6, 1, 2, "model.call", "subagent:gp", task_id="t"),  # a child of the step: run again
        event(7, 1, 3, "model.call"),  # journaled, its step never checkpointed: asked again
        event(8, 2, None, "run.recovered", "worker"),
        event(9, 2, None, "run.start", "worker"),
        event(10, 2, 2, "intervention", action="recovered_call", tool_call_id="b", note="started by attempt 1"),
        event(11, 2, 2, "model.call", "subagent:gp", task_id="t"),
        event(12, 2, 3, "model.call"),
        event(13, 2, 3, "run.end", None),
    ]
    assert [e.seq for e in as_finished(events)] == [2, 3, 4, 9, 10, 11, 12, 13]
    ended_in_a_lost_step = [*events[:3], event(8, 2, 2, "run.end", None)]  # the end redoes no step
    assert [e.seq for e in as_finished(ended_in_a_lost_step)] == [2, 3, 8]
    assert recovered_calls(events) == {"b": "started by attempt 1"}
    single = events[:7]
    assert as_finished(single) == single  # one attempt: the journal as it is


def test_an_older_journal_s_raised_lead_call_is_read_from_its_error_result() -> None:
    text = exception_message("bash", "c1", OSError("gone   away")).text
    assert _raised({"status": "error", "error_type": "OSError"}, text) == ("OSError", "gone away")
    assert _raised({"status": "error", "error_type": "OSError", "error_message": "journaled"}, text) == (
        "OSError", "journaled")
    assert _raised({"status": "error", "error_type": "ValueError"}, text) is None  # not that exception's
    assert _raised({"status": "ok"}, text) is None
