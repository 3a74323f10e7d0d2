"""``keel replay``'s engine through the real runtime: the coordinate on all three surfaces, the
aligned timeline of a run with subagents, compactions and a guard cap, its export replayed
offline to the same journal and final state, a miss that is loud, a fork, and the divergence
checker on a deliberately corrupted journal.

The recording and the replay are two runtimes (the replay's has every model swapped for the
export) on one database, as ``keel replay --rerun`` runs them: SQLite with the memory bridge, and
PostgreSQL with Redis (where the stream outlives the runtime that published it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from runtime_support import (
    Keel,
    _param,
    backend_matrix,
    call,
    finished,
    journal,
    run_to_end,
    start,
    thread_messages,
    turn,
)

from agentkeel.config import KeelConfig
from agentkeel.runtime.checkpoints.stamping import COORDINATE_KEY
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.replay import (
    compare,
    final_state,
    first_of_thread,
    fork,
    journal_signature,
    offline_config,
    recorded_tools,
    rerun,
)
from agentkeel.runtime.script_export import export_script
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.timeline import Item, Timeline, load_timeline

pytestmark = backend_matrix([_param("sqlite", "memory"), _param("postgres", "redis")])

GP = "general-purpose"


def task(topic: str) -> dict[str, Any]:
    return call("task", description=f"Sentence about {topic}", prompt=f"Write one sentence about {topic}",
                subagent_type=GP)


def recorded_script() -> dict[str, list[dict[str, Any]]]:
    """Two runaway children (the loop guard caps each), the lead's own work, enough messages for
    the lead's compaction, and a summarizer for every compaction (the children's too)."""
    runaway = call("write_file", path="/workspace/outputs/s{instance}.md", content="A sentence.\n")
    return {
        "lead": [
            turn("Delegating.", task("rivers"), task("hills"), usage=(1000, 60)),
            turn("Noting.", call("write_file", path="/workspace/outputs/notes.md", content="n1\n"), usage=(1200, 20)),
            turn("Listing.", call("ls", path="/workspace/outputs"), usage=(1300, 20)),
            turn("Listing again.", call("ls", path="/workspace"), usage=(1300, 20)),
            turn("All done: two sentences and a note.", usage=(1400, 10)),
        ],
        GP: [turn(None, runaway, usage=(500, 30), repeat="forever")],
        "summarization": [turn("Summary of the work so far.", usage=(50, 8), repeat="forever")],
    }


LIMITS = {"summarization": {"enabled": True, "trigger_messages": 6, "keep_messages": 2}}


def recording_config(keel: Keel) -> KeelConfig:
    return keel.config({"rec": recorded_script()}, limits=LIMITS)


def flat(items: list[Item]) -> list[Item]:
    return [x for i in items for x in [i, *flat(i.children)]]


async def record_run(keel: Keel, config: KeelConfig) -> tuple[str, Timeline]:
    async with keel.open(config) as rt:
        record = await run_to_end(rt, keel_thread(), "Write two sentences and a note.")
        timeline = await load_timeline(rt, record.run_id)
    assert timeline is not None
    return record.run_id, timeline


def keel_thread() -> str:
    from runtime_support import new_thread_id

    return new_thread_id("rec")


async def test_every_surface_carries_the_coordinate_and_the_timeline_aligns_them(keel: Keel) -> None:
    config = recording_config(keel)
    async with keel.open(config) as rt:
        record = await run_to_end(rt, keel_thread(), "Write two sentences and a note.")
        events = await journal(rt, record.run_id)
        checkpoints = [t async for t in rt.checkpointer.alist({"configurable": {"thread_id": record.thread_id}})]
        timeline = await load_timeline(rt, record.run_id)
    assert record.status == RunStatus.success
    assert timeline is not None and timeline.divergences == [], timeline.divergences
    # journal: every record stamped with the attempt; those of the graph's steps with their step
    assert {e.attempt for e in events} == {1}
    steps = [e.step for e in events if e.kind == "model.call" and e.caller == "lead"]
    assert all(isinstance(s, int) for s in steps) and steps == sorted(steps) and len(set(steps)) == len(steps)
    # checkpoints: each names the run, attempt, its own step and the journal it reflects
    stamps = [t.metadata[COORDINATE_KEY] for t in checkpoints]
    assert {(s["run_id"], s["attempt"]) for s in stamps} == {(record.run_id, 1)}
    assert [s["step"] for s in stamps] == [t.metadata["step"] for t in checkpoints]
    by_seq = {e.seq: e for e in events}
    for stamp in stamps:  # a checkpoint covers no record of a later step
        assert all(e.step is None or e.step <= stamp["step"] for s, e in by_seq.items() if s <= stamp["journal_seq"])
    # stream: every retained event stamped, in journal order
    assert timeline.stream_state == "retained" and timeline.stream
    assert all(i.data["stamped"] and i.attempt == 1 for i in timeline.stream)
    seqs = [i.journal_seq for i in timeline.stream]
    assert seqs == sorted(seqs)

    items = timeline.items
    children = [i for i in items if i.kind == "subagent.start"]
    assert len(children) == 2
    for child in children:  # each child's own records, and nobody else's, under its task
        task_id = child.data["task_id"]
        assert child.children and all(c.data.get("task_id") == task_id for c in child.children)
        assert any(c.kind == "compaction" for c in child.children)
        assert child.data["end"]["stop_reason"] == "loop_capped"
        assert any(c.kind == "intervention" and c.data["action"] == "withhold" for c in child.children)
    top_kinds = [i.kind for i in items if i.source == "journal"]
    assert "compaction" in top_kinds  # the lead's own compaction
    assert [i.data["code"] for i in items if (i.source, i.kind) == ("journal", "stop_reason")] == ["loop_capped"] * 2
    writes = [i for i in items if i.kind == "tool.call" and i.data["name"] == "write_file"]
    assert [(f["path"], f["change"]) for f in writes[0].files] == [("/workspace/outputs/notes.md", "added")]
    assert [a["began"] for a in timeline.to_dict()["attempts"]] == ["started"]
    json.dumps(timeline.to_dict())  # the console's data


async def test_the_export_replays_offline_to_the_same_journal_and_final_state(keel: Keel, tmp_path: Path) -> None:
    config = recording_config(keel)
    async with keel.open(config) as rt:
        original = await run_to_end(rt, keel_thread(), "Write two sentences and a note.")
        events = await journal(rt, original.run_id)
        assert await first_of_thread(rt, original)
        recorded_state = await final_state(rt, original)
        script = export_script(events, await thread_messages(rt, original.thread_id))
    tasks = [e.data["task_id"] for e in events if e.kind == "subagent.start"]
    assert set(script["agents"]) == {"lead", "summarization", *(f"{GP}@{t}" for t in tasks),
                                     *(f"summarization@{t}" for t in tasks)}
    path = tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump(script, sort_keys=False))

    offline = offline_config(config, path)
    assert {m.use for m in offline.models} == {"scripted"}
    async with keel.open(offline) as rt:
        replay = await rerun(rt, original)
        replayed = await journal(rt, replay.run_id)
        replay_state = await final_state(rt, replay, original)
        timeline = await load_timeline(rt, replay.run_id)
    assert replay.status == original.status == RunStatus.success
    assert compare(journal_signature(events, original), journal_signature(replayed, replay, original)) == []
    assert compare(recorded_state, replay_state) == []
    assert recorded_state["files"] and recorded_state["durable"]["compaction"]
    assert replay.usage == original.usage
    # the same stop reasons, from the same children (which of two parallel children ends first is the scheduler's)
    assert sorted((r["code"], r["source"]) for r in replay.stop_reasons) == sorted(
        (r["code"], r["source"]) for r in original.stop_reasons)
    assert timeline is not None and timeline.divergences == []

    # With the recording answering the tools: parallel children, guard-withheld calls and
    # compactions still match call for call (all file tools here, so each runs and is checked).
    async with keel.open(offline) as rt:
        tools = await recorded_tools(rt, original)
        matched = await rerun(rt, original, tools=tools)
        matched_journal = await journal(rt, matched.run_id)
        matched_state = await final_state(rt, matched, original)
    assert matched.status == RunStatus.success, matched.error
    assert tools.misses == [] and len(tools.live) == sum(len(c) for c in tools.calls.values()) > 2
    assert {agent for agent in tools.calls} == {"lead", *tasks}
    assert compare(journal_signature(events, original), journal_signature(matched_journal, matched, original)) == []
    assert compare(recorded_state, matched_state) == []

    # A miss is loud: the same export without the lead's last answer ends the replay in an error.
    script["agents"]["lead"].pop()
    path.write_text(yaml.safe_dump(script, sort_keys=False))
    async with keel.open(offline_config(config, path)) as rt:
        short = await rerun(rt, original)
    assert short.status == RunStatus.error and "ScriptExhaustedError" in (short.error or ""), short.error

    # So is a tool result that comes out different: the lead's next turn expects the recorded one.
    listing = script["agents"]["lead"][2]
    assert listing["tool_calls"][0]["name"] == "ls" and "expect" in script["agents"]["lead"][3]
    listing["tool_calls"][0]["args"] = {"path": "/workspace/uploads"}
    path.write_text(yaml.safe_dump(script, sort_keys=False))
    async with keel.open(offline_config(config, path)) as rt:
        diverged = await rerun(rt, original)
    assert diverged.status == RunStatus.error and "ScriptExpectationError" in (diverged.error or ""), diverged.error


async def test_a_fork_from_a_step_continues_with_another_model(keel: Keel) -> None:
    config = keel.config({"rec": recorded_script(), "other": [turn("Forked answer.")]}, limits=LIMITS)
    async with keel.open(config) as rt:
        original = await run_to_end(rt, keel_thread(), "Write two sentences and a note.")
        timeline = await load_timeline(rt, original.run_id)
        assert timeline is not None
        # the checkpoint after the lead's first write: its tool step
        write = next(i for i in timeline.items if i.kind == "tool.call" and i.data["name"] == "write_file")
        forked = await fork(rt, original, write.step, model_name="other")
        fork_events = await journal(rt, forked.run_id)
    assert forked.status == RunStatus.success and forked.thread_id == original.thread_id
    lead_calls = [e for e in fork_events if e.kind == "model.call" and e.caller == "lead"]
    assert [e.data["output"]["text"] for e in lead_calls] == ["Forked answer."]
    assert all(e.step > write.step for e in lead_calls)


async def test_the_checker_flags_a_corrupted_journal(keel: Keel) -> None:
    config = recording_config(keel)
    async with keel.open(config) as rt:
        record = await run_to_end(rt, keel_thread(), "Write two sentences and a note.")
        events = await journal(rt, record.run_id)
        last = events[-1].seq
        clean = await load_timeline(rt, record.run_id)
        assert clean is not None and clean.divergences == []
        forged = [
            # a seq skipped, then a stop reason after the terminal run.end
            JournalEvent(record.run_id, record.thread_id, last + 2, "stop_reason",
                         {"code": "token_capped", "source": "middleware:TokenBudget"}, "middleware:TokenBudget",
                         attempt=1, step=events[-1].step),
            # a lead tool result whose call no checkpoint holds
            JournalEvent(record.run_id, record.thread_id, last + 3, "tool.call",
                         {"name": "write_file", "call_id": "call-forged", "status": "ok"}, "lead", attempt=1),
            # an attempt that never began
            JournalEvent(record.run_id, record.thread_id, last + 4, "intervention",
                         {"middleware": "X", "action": "warn"}, "middleware:X", attempt=7),
        ]
        await rt.journal.append(forged)
        corrupted = await load_timeline(rt, record.run_id)
    assert corrupted is not None
    codes = {d.code for d in corrupted.divergences}
    assert codes == {"journal_gap", "stop_after_terminal", "result_without_call", "attempt_gap"}, corrupted.divergences
    gap = next(d for d in corrupted.divergences if d.code == "journal_gap")
    assert gap.journal_seq == last + 1 and str(last + 1) in gap.detail


async def test_a_stream_event_after_end_and_a_broken_history_are_flagged(keel: Keel) -> None:
    config = keel.config({"rec": [turn("Looking.", call("ls", path="/workspace")), turn("Done.")]})
    async with keel.open(config) as rt:
        created = await start(rt, keel_thread(), "look")
        record = await finished(rt, created.run_id)
        timeline = await load_timeline(rt, record.run_id)
    assert timeline is not None and timeline.divergences == []
    end = next(e for e in timeline.events if e.kind == "run.end")
    late = Item("stream", "values", 1, None, end.seq, data={"stamped": True}, ident=99)
    timeline.stream.append(late)
    timeline.messages = [m for m in timeline.messages if m.type != "tool"]  # a call left unanswered
    from agentkeel.runtime.divergence import check

    codes = [d.code for d in check(timeline)]
    assert "stream_after_end" in codes and "grammar" in codes and "result_without_call" not in codes
    timeline.messages = timeline.messages[:2]  # the user's request and a call still pending: not broken
    assert "grammar" not in [d.code for d in check(timeline)]


async def test_a_recovered_run_shows_its_attempts_and_the_recovery(keel: Keel) -> None:
    from datetime import UTC, datetime, timedelta

    config = keel.config({"rec": [turn("Looking.", call("ls", path="/workspace")), turn("Resumed fine.")]},
                         assistants=[{"assistant_id": "lead", "on_worker_lost": "resume"}], limits={"lease_ttl_s": 3})
    async with keel.open(config, executes="none") as admitting:
        lost = await start(admitting, keel_thread(), "go")
        past = datetime.now(UTC) - timedelta(seconds=5)  # claimed by a ghost whose lease expired
        assert await admitting.store.claim_next("ghost-host:1:dead", past, datetime.now(UTC), run_ids=[lost.run_id])
    async with keel.open(config) as rt:
        record = await finished(rt, lost.run_id)
        timeline = await load_timeline(rt, record.run_id)
    assert record.status == RunStatus.success and record.attempt == 2
    assert timeline is not None and timeline.divergences == [], timeline.divergences
    (attempt,) = timeline.to_dict()["attempts"]
    assert (attempt["attempt"], attempt["began"], attempt["ended"]) == (2, "resumed", "success")
    assert attempt["lost_owner"] == "ghost-host:1:dead"
    kinds = [i.kind for i in timeline.items if i.source == "journal"]
    assert kinds[:2] == ["run.recovered", "run.start"]
    assert {i.attempt for i in timeline.items} == {2}


async def test_a_running_run_has_a_live_stream_and_no_divergence_yet(keel: Keel) -> None:
    from runtime_support import wait_status, wait_until

    config = keel.config({"rec": [turn("Slow answer.", delay_ms=1500)]})
    async with keel.open(config) as rt:
        created = await start(rt, keel_thread(), "take your time")
        await wait_status(rt, created.run_id, RunStatus.running)

        async def started() -> Timeline | None:
            timeline = await load_timeline(rt, created.run_id)
            return timeline if timeline is not None and timeline.stream else None

        live = await wait_until(started, what="the run's first stream event")
        assert live.stream_state == "live" and live.divergences == [], live.divergences
        assert all(i.attempt == 1 and i.data["stamped"] for i in live.stream)  # the journal may still be buffered
        record = await finished(rt, created.run_id)
        done = await load_timeline(rt, record.run_id)
    assert done is not None and done.divergences == [] and done.items[-1].kind in ("run.end", "values", "checkpoint")
