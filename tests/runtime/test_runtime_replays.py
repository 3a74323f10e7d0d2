"""Incident replays through the whole runtime: the default lead chain, the strict scripted model,
a real store and stream. Each asserts the files, the journal and the run's stop reasons.

The incidents are the ones in ``shared/reference/incidents.md``: a loop that wrote one file forever,
a weekly report that appended one section five times, a safety stop whose tool call still ran, a
run that spent past its budget, and a warning that broke call/result adjacency at a strict provider.
"""

from __future__ import annotations

from runtime_support import (
    LIGHT_MATRIX,
    backend_matrix,
    call,
    journal,
    new_thread_id,
    run_to_end,
    thread_messages,
    thread_status,
    turn,
    workspace,
)

from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(LIGHT_MATRIX)


def _kinds(events: list, kind: str) -> list:
    return [e for e in events if e.kind == kind]


def _tool_calls(events: list, name: str) -> list:
    return [e for e in _kinds(events, "tool.call") if e.data["name"] == name]


def _blocked(events: list) -> list:
    return [e for e in _kinds(events, "intervention")
            if e.data["middleware"] == "ReadBeforeWrite" and e.data["action"] == "blocked"]


def _codes(record) -> list[str]:
    return [entry["code"] for entry in record.stop_reasons]


async def test_identical_write_forever_stops_with_loop_capped_and_a_final_answer(keel) -> None:
    forever = turn("Writing the sentence.", call("write_file", path="/workspace/out/a.txt", content="A."),
                   usage=(200, 12), repeat="forever")
    config = keel.config({"loop": [forever]})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        record = await run_to_end(rt, thread)
        events = await journal(rt, record.run_id)
        messages = await thread_messages(rt, thread)

    assert record.status is RunStatus.success
    assert record.stop_reason == "loop_capped"
    assert _codes(record).count("loop_capped") == 1
    # Five identical tool-calling turns: the fifth is withheld, plus one concluding call.
    assert len(_kinds(events, "model.call")) == 6
    # The first write created the file; the next three were overwrites of a file the agent never
    # read, so the gate answered them without running the tool.
    assert len(_tool_calls(events, "write_file")) == 1
    assert len(_blocked(events)) == 3
    assert (workspace(config, thread) / "out" / "a.txt").read_text() == "A."
    final = messages[-1]
    assert final.type == "ai" and not final.tool_calls and final.text
    stop_events = _kinds(events, "stop_reason")
    assert [e.data["code"] for e in stop_events] == ["loop_capped"]
    assert stop_events[0].seq == record.stop_reasons[0]["seq"]


async def test_weekly_report_appends_exactly_one_section(keel) -> None:
    path = "/workspace/outputs/weekly.md"
    script = [
        turn("Starting the report.", call("write_file", path=path, content="# Weekly\n")),
        turn("Adding the US section.", call("write_file", path=path, content="## US\nMarkets rose.\n", append=True)),
        turn("Let me check the end of the file.", call("read_file", path=path, start_line=1, end_line=5)),
        turn("Adding the US section.", call("write_file", path=path, content="## US\nMarkets rose.\n", append=True)),
        turn("Adding the US section.", call("write_file", path=path, content="## US\nMarkets rose.\n", append=True)),
        turn("The weekly report is done."),
    ]
    config = keel.config({"weekly": script})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        record = await run_to_end(rt, thread)
        events = await journal(rt, record.run_id)

    text = (workspace(config, thread) / "outputs" / "weekly.md").read_text()
    assert text == "# Weekly\n## US\nMarkets rose.\n"
    assert text.count("## US") == 1
    assert record.status is RunStatus.success and record.stop_reasons == []
    assert len(_blocked(events)) == 2
    # Blocked writes never reach the tool: only the two that passed the gate ran.
    assert [e.data["status"] for e in _tool_calls(events, "write_file")] == ["ok", "ok"]
    changed = _kinds(events, "file.changed")
    assert [e.data["path"] for e in changed] == [path]


async def test_content_filter_with_a_write_call_writes_nothing(keel) -> None:
    script = [
        turn("Here is the file", call("write_file", path="/workspace/outputs/x.md", content="partial"),
             finish_reason="content_filter"),
        turn("I can't continue with that request."),
    ]
    config = keel.config({"filtered": script})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        record = await run_to_end(rt, thread)
        events = await journal(rt, record.run_id)
        messages = await thread_messages(rt, thread)

    assert not (workspace(config, thread) / "outputs" / "x.md").exists()
    assert _tool_calls(events, "write_file") == []
    assert record.status is RunStatus.success
    assert _codes(record) == ["safety_capped"] and record.stop_reason == "safety_capped"
    stripped = next(m for m in messages if m.type == "ai" and m.additional_kwargs.get("agentkeel_suppressed"))
    assert not stripped.tool_calls and "tool_calls" not in stripped.additional_kwargs
    assert messages[-1].text == "I can't continue with that request."


async def test_usage_past_the_budget_ends_token_capped(keel) -> None:
    script = [
        turn("Listing.", call("ls", path="/workspace"), usage=(3000, 100)),
        turn("Listing again.", call("ls", path="/workspace/outputs"), usage=(3000, 100)),
        turn("Summary of what I found."),
    ]
    config = keel.config({"spender": script}, limits={"token_budget": {"max_tokens": 5000}})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, new_thread_id())
        events = await journal(rt, record.run_id)

    assert record.status is RunStatus.success
    assert _codes(record) == ["token_capped"]
    assert record.stop_reasons[0]["data"]["budget"] == 5000
    assert len(_tool_calls(events, "ls")) == 1  # the second call was withheld
    assert record.usage["total_tokens"] >= 6200


async def test_loop_warning_keeps_call_result_adjacency_at_a_strict_provider(keel) -> None:
    same = call("grep", pattern="TODO", path="/workspace")
    script = [
        turn("Searching.", same),
        turn("Searching again.", same),
        turn("And again.", same),
        # The strict scripted model rejects any request where the warning sits between a call and
        # its results; this turn also proves the warning arrived, at the end of the next request.
        turn("Understood, finishing.", expect={"contains": "[LOOP DETECTED]"}),
    ]
    config = keel.config({"warned": script})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        record = await run_to_end(rt, thread)
        messages = await thread_messages(rt, thread)
        events = await journal(rt, record.run_id)

    assert record.status is RunStatus.success, record.error
    assert record.stop_reasons == []
    assert not any("[LOOP DETECTED]" in str(m.content) for m in messages)  # transient, never state
    (warning,) = [e for e in _kinds(events, "intervention") if e.data["middleware"] == "LoopDetection"]
    assert warning.data["action"] == "warn"
    # Queued after the third response, delivered with the fourth request: after the third result.
    third_result = [e for e in _tool_calls(events, "grep")][2]
    fourth_call = _kinds(events, "model.call")[3]
    assert third_result.seq < fourth_call.seq and warning.seq < fourth_call.seq
    assert len(_tool_calls(events, "grep")) == 3 and _kinds(events, "file.changed") == []


async def test_clarification_pauses_the_run_and_a_resume_answers_it(keel) -> None:
    ask = [
        turn("I need to know the audience first.",
             call("ask_clarification", question="Who is the report for?", options=["engineers", "executives"]),
             call("write_file", path="/workspace/outputs/report.md", content="# Guessing\n")),
    ]
    # Each run replays its model's script from turn 1: the resumed run plays its own.
    after = [
        turn("Writing it for executives.",
             call("write_file", path="/workspace/outputs/report.md", content="# For executives\n"),
             expect={"contains": "The user answered: executives"}),
        turn("Done: the report is for executives."),
    ]
    config = keel.config({"asker": ask, "after": after})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        first = await run_to_end(rt, thread, "Write the report.")
        report = workspace(config, thread) / "outputs" / "report.md"
        assert not report.exists()  # the sibling write never ran before the answer
        assert first.status is RunStatus.success
        assert _codes(first) == ["clarification_requested"]
        assert first.stop_reasons[0]["data"]["question"] == "Who is the report for?"
        assert await thread_status(rt, thread) == "interrupted"

        second = await run_to_end(rt, thread, None, command={"resume": "executives"}, model_name="after")
        assert second.status is RunStatus.success, second.error
        assert second.stop_reasons == []
        assert report.read_text() == "# For executives\n"
        assert await thread_status(rt, thread) == "idle"


async def test_a_flood_of_tool_output_is_saved_and_the_ledger_names_the_step(keel) -> None:
    script = [
        turn("Searching the log.", call("grep", "call_flood", pattern="match", path="/workspace/log.txt")),
        turn("Summarised from the excerpt."),
    ]
    config = keel.config({"flood": script})
    thread = new_thread_id()
    (workspace(config, thread) / "log.txt").write_text(
        "".join(f"match {i:04d} " + "x" * 90 + "\n" for i in range(300))
    )
    async with keel.open(config) as rt:
        record = await run_to_end(rt, thread)
        events = await journal(rt, record.run_id)
        messages = await thread_messages(rt, thread)

    result = next(m for m in messages if m.type == "tool")
    assert len(result.content) <= 12_000 and "/workspace/.tool-results/grep-" in result.content
    (saved,) = [e for e in _kinds(events, "file.changed") if e.data["path"].startswith("/workspace/.tool-results/")]
    assert (saved.data["tool_call_id"], saved.data["tool_name"]) == ("call_flood", "ToolOutputBudget")
    full = (workspace(config, thread) / saved.data["path"].removeprefix("/workspace/")).read_text()
    assert full.count("match 0") == 200 and len(full) > 12_000  # grep stops at 200 matches; all kept


async def test_drifting_arguments_escape_the_loop_guard_but_not_the_budget(keel) -> None:
    # Incident #3875, variant B: the content changes every turn, so no two call sets are identical.
    drift = turn("Writing the sentence again.",
                 call("write_file", path="/workspace/out/a.txt", content="A. (turn {turn})"),
                 usage=(3000, 12), repeat="forever")
    config = keel.config({"drift": [drift]}, limits={"token_budget": {"max_tokens": 20_000}})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        record = await run_to_end(rt, thread)
        events = await journal(rt, record.run_id)

    assert record.status is RunStatus.success
    assert _codes(record) == ["token_capped"]  # not loop_capped: the hash never repeated
    assert record.usage["total_tokens"] >= 20_000
    # 3,012 tokens a turn: the seventh response crosses 20,000 and its call is withheld; then the
    # one concluding call. Nothing ran after the cap.
    assert len(_kinds(events, "model.call")) == 8
    assert (workspace(config, thread) / "out" / "a.txt").read_text() == "A. (turn 1)"


async def test_turn_limit_keeps_the_partial_answer(keel) -> None:
    # Variant C: no loop and a large budget; only the turn limit ends it, and the work survives.
    script = [
        turn("Listing part {turn} of the inventory.", call("ls", path="/workspace/part{turn}"), repeat="forever"),
    ]
    config = keel.config({"long": script}, limits={"turn_limit": {"max_turns": 4}})
    async with keel.open(config) as rt:
        thread = new_thread_id()
        record = await run_to_end(rt, thread)
        messages = await thread_messages(rt, thread)

    assert record.status is RunStatus.success and _codes(record) == ["turn_capped"]
    capped = [m for m in messages if m.type == "ai" and m.additional_kwargs.get("agentkeel_withheld")]
    # The fourth turn's text survives with its calls withheld; the concluding call (this script
    # keeps calling tools even then) is withheld too, and the run ends there: one extra call only.
    assert [m.text.split("\n")[0] for m in capped] == ["Listing part 4 of the inventory.", "Listing part 5 of the inventory."]
    assert [m.type for m in messages].count("tool") == 3  # turns 1-3 ran their calls
    assert messages[-1] is capped[-1] and not messages[-1].tool_calls
