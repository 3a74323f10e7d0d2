"""A run from admission to END on every backend: record, usage, journal, stream, files, ledger."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from runtime_support import (
    FULL_MATRIX,
    UNGATED,
    Keel,
    backend_matrix,
    call,
    data_events,
    describe,
    journal,
    new_thread_id,
    run_to_end,
    sha256,
    stream_events,
    thread_state,
    thread_status,
    turn,
    workspace,
)

from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.ledger import build_ledger
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(FULL_MATRIX)

REPORT = "# Report\nstatus: draft\n"
NOTES_BEFORE = "alpha notes\n"
NOTES_AFTER = "omega notes\n"
USAGE = [(120, 15), (240, 25), (360, 35)]  # (input, output) per model turn

HAPPY = [
    turn(
        "Writing the report.",
        call("write_file", "call_w1", path="/workspace/outputs/report.md", content=REPORT),
        usage=USAGE[0],
    ),
    turn(None, call("str_replace", "call_s1", path="/workspace/notes.txt", old="alpha", new="omega"), usage=USAGE[1]),
    turn("Report written.", usage=USAGE[2]),
]


def _tally(pairs: list[tuple[int, int]]) -> dict[str, int]:
    tokens_in, tokens_out = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out,
            "calls": len(pairs)}


async def test_happy_path_two_tool_turns_and_a_final_answer(keel: Keel) -> None:
    config = keel.config({"scripted-m": HAPPY}, limits=UNGATED)
    thread = new_thread_id("happy")
    (workspace(config, thread) / "notes.txt").write_text(NOTES_BEFORE)

    async with keel.open(config) as rt:
        record = await run_to_end(rt, thread, "Write the report, then fix the notes.")

        # -- the record
        assert record.status == RunStatus.success, record.error
        assert record.stop_reasons == [] and record.stop_reason is None and record.error is None
        assert record.attempt == 1 and record.started_at and record.ended_at
        assert record.started_at <= record.ended_at
        total = _tally(USAGE)
        usage = record.usage
        assert {k: usage[k] for k in ("input_tokens", "output_tokens", "total_tokens")} == {
            k: total[k] for k in ("input_tokens", "output_tokens", "total_tokens")
        }
        assert usage["by_caller"]["lead"] == total
        assert usage["by_caller"]["subagent"]["calls"] == 0
        assert usage["by_model"] == {"scripted-m": total}
        assert (await thread_status(rt, thread)) == "idle"

        # -- the journal
        events = await journal(rt, record.run_id)
        seqs = [e.seq for e in events]
        assert seqs[0] == 1 and all(a < b for a, b in pairwise(seqs)), seqs
        kinds = [e.kind for e in events]
        assert kinds[0] == "run.start" and kinds[-1] == "run.end", kinds
        counts = Counter(kinds)
        assert counts["run.start"] == counts["run.end"] == 1
        assert counts["model.call"] == 3 and counts["tool.call"] == 2 and counts["file.changed"] == 2
        assert "error" not in counts and "stop_reason" not in counts
        calls = [k for k in kinds if k in ("model.call", "tool.call")]
        assert calls == ["model.call", "tool.call", "model.call", "tool.call", "model.call"]
        model_calls = [e for e in events if e.kind == "model.call"]
        assert [(e.data["input_tokens"], e.data["output_tokens"]) for e in model_calls] == USAGE
        assert [e.data["tool_calls"] for e in model_calls] == [1, 1, 0]
        assert all(e.caller == "lead" and e.data["model"] == "scripted-m" for e in model_calls)
        tool_seq = {e.data["call_id"]: e.seq for e in events if e.kind == "tool.call"}
        tools = {e.data["call_id"]: e.data for e in events if e.kind == "tool.call"}
        assert set(tools) == {"call_w1", "call_s1"}
        assert tools["call_w1"]["name"] == "write_file" and tools["call_s1"]["name"] == "str_replace"
        assert all(t["status"] == "ok" for t in tools.values())
        changed = {e.data["path"]: e for e in events if e.kind == "file.changed"}
        report, notes = changed["/workspace/outputs/report.md"], changed["/workspace/notes.txt"]
        assert report.data["change"] == "added" and report.data["before_sha256"] is None
        assert report.data["after_sha256"] == sha256(REPORT)
        assert (report.data["tool_call_id"], report.data["tool_name"]) == ("call_w1", "write_file")
        assert report.data["tool_seq"] == tool_seq["call_w1"] < report.seq
        assert notes.data["change"] == "modified"
        assert (notes.data["before_sha256"], notes.data["after_sha256"]) == (sha256(NOTES_BEFORE), sha256(NOTES_AFTER))
        assert (notes.data["tool_call_id"], notes.data["tool_name"]) == ("call_s1", "str_replace")
        assert notes.data["tool_seq"] == tool_seq["call_s1"]
        start, end = events[0].data, events[-1].data
        assert start["attempt"] == 1 and start["model"] == "scripted-m" and start["assistant_id"] == "lead"
        assert end["status"] == "success" and end["usage"] == record.usage and end["rolled_back"] is False

        # -- the stream, replayed from the start
        items = await stream_events(rt, record.run_id, "-1")
        assert items[0].event == "metadata"
        assert items[0].data == {"run_id": record.run_id, "attempt": 1}
        assert items[-1].kind is EventKind.end
        assert all(i.kind is EventKind.data for i in items[:-1])  # no gap, no heartbeat
        assert [i.seq for i in items[:-1]] == list(range(1, len(items)))
        values = data_events(items, "values")
        assert len(values) >= 4
        final = values[-1].data["messages"]
        assert [m["type"] for m in final] == ["human", "ai", "tool", "ai", "tool", "ai"]
        assert final[-1]["content"] == "Report written."

        # -- the workspace and the thread's state
        root = workspace(config, thread)
        assert (root / "outputs" / "report.md").read_text() == REPORT
        assert (root / "notes.txt").read_text() == NOTES_AFTER
        snapshot = await thread_state(rt, thread)
        assert describe(snapshot.values["messages"])[0] == ("human", "Write the report, then fix the notes.")
        assert len(snapshot.values["messages"]) == 6

        # -- the ledger answers the same questions from the same facts
        ledger = await build_ledger(record, rt.journal, rt.checkpointer)
        assert ledger["status"] == "success" and ledger["clean"] is True
        assert ledger["stop_reason"] is None and ledger["stop_reasons"] == []
        assert ledger["usage"] == record.usage
        assert ledger["model_calls"] == 3 and ledger["model_errors"] == 0
        assert ledger["tool_calls"] == {"write_file": 1, "str_replace": 1} and ledger["tool_errors"] == 0
        assert ledger["journal_events"] == len(events)
        assert {(f["path"], f["tool_call_id"], f["tool_seq"]) for f in ledger["files_changed"]} == {
            ("/workspace/outputs/report.md", "call_w1", tool_seq["call_w1"]),
            ("/workspace/notes.txt", "call_s1", tool_seq["call_s1"]),
        }
        assert ledger["resume"] == {
            "thread_id": thread, "checkpoint_id": snapshot.config["configurable"]["checkpoint_id"],
            "question": None,  # the run did not pause on a question
        }
        assert ledger["duration_s"] is not None and ledger["duration_s"] >= 0


async def test_a_follow_up_run_continues_the_thread(keel: Keel) -> None:
    """The second run sees the first one's history (its model is asked to prove it) and the
    thread's state holds both runs' messages in order."""
    config = keel.config({
        "first": [turn("answer-one")],
        "second": [turn("answer-two", expect={"contains": "answer-one"})],
    })
    thread = new_thread_id("follow")
    async with keel.open(config) as rt:
        one = await run_to_end(rt, thread, "question one", model_name="first")
        two = await run_to_end(rt, thread, "question two", model_name="second")
        assert (one.status, two.status) == (RunStatus.success, RunStatus.success), two.error
        snapshot = await thread_state(rt, thread)
        assert describe(snapshot.values["messages"]) == [
            ("human", "question one"), ("ai", "answer-one"), ("human", "question two"), ("ai", "answer-two"),
        ]
        assert [r.run_id for r in await rt.store.list_runs(thread_id=thread)] == [two.run_id, one.run_id]
        assert two.kwargs["model_name"] == "second"
