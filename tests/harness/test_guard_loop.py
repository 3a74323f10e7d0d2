"""LoopDetection on the real agent loop (strict scripted model) and its pure helpers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from guard_kit import KeepGoing, assert_provider_valid, counting_tool, final_ai, hints, run_agent, script
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage

from agentkeel.harness.middleware.loop_detection import LoopDetection, LoopTracker, call_key, call_set_hash
from agentkeel.harness.middleware.responses import WITHHELD, is_hint, was_stripped
from agentkeel.limits import FrequencyOverride, LoopDetectionLimits


def turn(*calls: tuple[str, dict[str, Any]], repeat: int | str = 1, say: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"tool_calls": [{"name": n, "args": a} for n, a in calls], "repeat": repeat}
    return {**entry, "say": say} if say else entry










# -- pure helpers -------------------------------------------------------------------------


def test_call_key_canonicalises_arguments() -> None:
    assert call_key({"name": "t", "args": {"b": 1, "a": 2}}) == call_key({"name": "t", "args": {"a": 2, "b": 1}})
    assert call_key({"name": "t", "args": '{"a": 2, "b": 1}'}) == call_key({"name": "t", "args": {"b": 1, "a": 2}})
    assert call_key({"name": "t", "args": {"q": '{"x": [1, 2]}'}}) == call_key({"name": "t", "args": {"q": {"x": [1, 2]}}})
    assert call_key({"name": "t", "args": {"a": 1}}) != call_key({"name": "t", "args": {"a": 2}})
    assert call_key({"name": "t", "args": {"a": 1}}) != call_key({"name": "u", "args": {"a": 1}})


def test_read_file_calls_bucket_by_200_lines() -> None:
    def key(**args: Any) -> str:
        return call_key({"name": "read_file", "args": {"path": "/workspace/a.txt", **args}})

    assert key(start_line=1, end_line=150) == key(start_line=20, end_line=199)
    assert key(start_line=150, end_line=20) == key(start_line=20, end_line=150)
    assert key(start_line=1, end_line=150) != key(start_line=201, end_line=300)
    assert key() != key(start_line=1, end_line=150)  # the whole file is not lines 1-150
    assert key() != call_key({"name": "read_file", "args": {"path": "/workspace/b.txt"}})


calls_strategy = st.lists(
    st.fixed_dictionaries({
        "name": st.sampled_from(["ls", "grep", "read_file", "web_search"]),
        "args": st.dictionaries(st.sampled_from(["path", "query", "n"]), st.integers(0, 3) | st.text(max_size=3)),
    }),
    min_size=1, max_size=5,
)


@given(calls_strategy, st.randoms())
def test_call_set_hash_ignores_call_order(calls: list[dict[str, Any]], rnd: Any) -> None:
    shuffled = list(calls)
    rnd.shuffle(shuffled)
    assert call_set_hash(shuffled) == call_set_hash(calls)
    assert len(call_set_hash(calls)) == 12


@given(st.lists(st.lists(st.sampled_from("abc"), min_size=1, max_size=4), min_size=1, max_size=30))
def test_frequency_layer_counts_every_call_in_a_sliding_window(responses: list[list[str]]) -> None:
    """Reference model: a tool trips iff its count among the last W calls (all calls of every
    response so far) reaches its hard limit — regardless of what else fired in the response."""
    limits = LoopDetectionLimits(
        warn_threshold=50, hard_limit=50, window_size=50, tool_freq_warn=3, tool_freq_hard_limit=5,
        tool_freq_overrides={"a": FrequencyOverride(warn=1, hard_limit=2), "c": FrequencyOverride(warn=2, hard_limit=7)},
    )
    tracker = LoopTracker(limits)
    assert tracker.freq_window == 50
    small = LoopDetectionLimits(window_size=5, hard_limit=5, tool_freq_warn=3, tool_freq_hard_limit=4)
    windowed = LoopTracker(small)
    assert windowed.freq_window == 5
    history: list[str] = []
    for names in responses:
        history.extend(names)
        calls = [{"name": n, "args": {"i": len(history), "j": k}} for k, n in enumerate(names)]
        for t, window in ((tracker, 50), (windowed, 5)):
            counts = Counter(history[-window:])
            expected = {n for n in set(names) if counts[n] >= t.thresholds(n)[1]}
            assert {trip.key for trip in t.observe(calls).trips if trip.layer == "frequency"} == expected


def test_both_layers_report_on_the_same_response() -> None:
    tracker = LoopTracker(LoopDetectionLimits(warn_threshold=2, tool_freq_overrides={"ls": FrequencyOverride(warn=2, hard_limit=9)}))
    tracker.observe([{"name": "ls", "args": {}}])
    verdict = tracker.observe([{"name": "ls", "args": {}}])
    assert len(verdict.warnings) == 2
    assert "repeating the same tool calls" in verdict.warnings[0]
    assert "called ls 2 times" in verdict.warnings[1]


# -- call-set layer on the agent ----------------------------------------------------------


async def test_three_identical_warn_and_five_stop(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    outcome = await run_agent(
        script(turn(("probe", {"n": 1}), repeat="forever", say="step {turn}")),
        [LoopDetection(LoopDetectionLimits())], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert len(outcome.requests) == 5
    assert counter["probe"] == 4  # the fifth call set was withheld, the tool never ran again
    assert [hints(r, "loop_warning") for r in outcome.requests[:3]] == [[], [], []]
    warning = outcome.requests[3][-1]
    assert is_hint(warning) and warning.name == "loop_warning"
    assert "[LOOP DETECTED] You are repeating the same tool calls" in str(warning.content)
    assert hints(outcome.requests[4], "loop_warning") == []  # warned once per hash
    assert_provider_valid(outcome)

    final = final_ai(outcome)
    assert final.id == "msg-k-lead-0-5"
    assert final.tool_calls == [] and "tool_calls" not in final.additional_kwargs
    assert final.content.startswith("step 5") and "[LOOP STOPPED]" in final.content
    assert final.additional_kwargs[WITHHELD]["tool_calls"][0]["args"] == {"n": 1}
    assert outcome.codes == ["loop_capped"]
    entry = outcome.stop_reasons[0]
    assert entry["cause"] == "msg-k-lead-0-5" and entry["source"] == "LoopDetection"
    assert entry["data"]["layer"] == "hash" and entry["data"]["count"] == 5 and entry["data"]["threshold"] == 5
    assert entry["data"]["hash"] == call_set_hash([{"name": "probe", "args": {"n": 1}}])
    assert [r["data"]["action"] for r in outcome.journal.kinds("intervention")] == ["warn", "withhold"]


async def test_different_arguments_do_not_count(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    outcome = await run_agent(
        script(turn(("probe", {"n": "{turn}"}), repeat=8), {"say": "done"}),
        [LoopDetection(LoopDetectionLimits())], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert counter["probe"] == 8 and outcome.codes == []
    assert not any(hints(r, "loop_warning") for r in outcome.requests)
    assert final_ai(outcome).content == "done"


async def test_order_of_calls_inside_a_response_does_not_change_the_hash(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    ab = turn(("alpha", {"n": 1}), ("beta", {"n": 2}))
    ba = turn(("beta", {"n": 2}), ("alpha", {"n": 1}))
    outcome = await run_agent(
        script(ab, ba, ab, ba, ab), [LoopDetection(LoopDetectionLimits())], tmp_path / "ws",
        tools=[counting_tool("alpha", counter), counting_tool("beta", counter)],
    )
    assert "repeating the same tool calls" in hints(outcome.requests[3], "loop_warning")[0]
    assert outcome.codes == ["loop_capped"]
    assert counter == Counter({"alpha": 4, "beta": 4})
    assert_provider_valid(outcome)


async def test_call_set_window_decays(tmp_path: Path) -> None:
    """X X X Y Y Y X X: eight X's would stop at the fifth, but a window of 5 holds only 2 of them."""
    counter: Counter[str] = Counter()
    x, y = ("probe", {"n": 1}), ("probe", {"n": 2})
    limits = LoopDetectionLimits(warn_threshold=3, hard_limit=5, window_size=5)
    outcome = await run_agent(
        script(turn(x, repeat=3), turn(y, repeat=3), turn(x, repeat=2), {"say": "done"}),
        [LoopDetection(limits)], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert outcome.codes == [] and counter["probe"] == 8
    assert [len(hints(r, "loop_warning")) for r in outcome.requests] == [0, 0, 0, 1, 0, 0, 1, 0, 0]


# -- frequency layer on the agent ---------------------------------------------------------


async def test_frequency_counts_every_call_of_a_multi_call_response(tmp_path: Path) -> None:
    """alpha fires first in response 1; beta's two calls there must still be counted, so beta
    warns at once and stops on its third call (DeerFlow returned at the first firing tool)."""
    counter: Counter[str] = Counter()
    limits = LoopDetectionLimits(tool_freq_overrides={
        "alpha": FrequencyOverride(warn=1, hard_limit=9), "beta": FrequencyOverride(warn=2, hard_limit=3),
    })
    outcome = await run_agent(
        script(turn(("alpha", {"n": 1}), ("beta", {"n": 1}), ("beta", {"n": 2})), turn(("beta", {"n": 3}), say="again")),
        [LoopDetection(limits)], tmp_path / "ws",
        tools=[counting_tool("alpha", counter), counting_tool("beta", counter)],
    )
    warning = hints(outcome.requests[1], "loop_warning")
    assert len(warning) == 1 and "called alpha 1 times" in warning[0] and "called beta 2 times" in warning[0]
    assert outcome.requests[1][-1].name == "loop_warning"
    assert outcome.codes == ["loop_capped"]
    assert outcome.stop_reasons[0]["data"] == {"layer": "frequency", "tool": "beta", "count": 3, "threshold": 3}
    assert counter == Counter({"alpha": 1, "beta": 2})
    assert final_ai(outcome).content.startswith("again")
    assert_provider_valid(outcome)


async def test_frequency_window_decays_and_warns_again(tmp_path: Path) -> None:
    """A window of 5 calls: p p p o o o p p never reaches 5 p's; p warns at 3, its count drops
    below 3, and it warns again when it climbs back."""
    counter: Counter[str] = Counter()
    p, o = ("probe", {"n": "{turn}"}), ("other", {"n": "{turn}"})
    limits = LoopDetectionLimits(window_size=5, hard_limit=5, tool_freq_warn=3, tool_freq_hard_limit=5)
    outcome = await run_agent(
        script(turn(p, repeat=3), turn(o, repeat=3), turn(p, repeat=3), {"say": "done"}),
        [LoopDetection(limits)], tmp_path / "ws",
        tools=[counting_tool("probe", counter), counting_tool("other", counter)],
    )
    assert outcome.codes == [] and counter == Counter({"probe": 6, "other": 3})
    warned = [i for i, r in enumerate(outcome.requests) if hints(r, "loop_warning")]
    assert warned == [3, 6, 9]  # probe at 3, other at 3, probe again after decaying
    assert "called other 3 times" in hints(outcome.requests[6], "loop_warning")[0]
    assert "called probe 3 times" in hints(outcome.requests[9], "loop_warning")[0]


# -- hard stop once per run ---------------------------------------------------------------


async def test_hard_stop_recorded_once_and_withheld_again(tmp_path: Path) -> None:
    counter: Counter[str] = Counter()
    limits = LoopDetectionLimits(warn_threshold=2, hard_limit=2)
    outcome = await run_agent(
        script(turn(("probe", {"n": 1}), repeat="forever", say="try {turn}")),
        [LoopDetection(limits), KeepGoing(times=2)], tmp_path / "ws", tools=[counting_tool("probe", counter)],
    )
    assert counter["probe"] == 1
    assert outcome.codes == ["loop_capped"]
    stripped = [m for m in outcome.messages if isinstance(m, AIMessage) and was_stripped(m)]
    assert [m.id for m in stripped] == ["msg-k-lead-0-2", "msg-k-lead-0-3", "msg-k-lead-0-4"]
    assert all(m.tool_calls == [] and "[LOOP STOPPED]" in m.content for m in stripped)
    assert_provider_valid(outcome)


async def test_hard_stop_drops_raw_provider_tool_call_fields() -> None:
    """A provider message carrying raw ``additional_kwargs.tool_calls`` loses them when withheld."""
    guard = LoopDetection(LoopDetectionLimits(warn_threshold=1, hard_limit=1, window_size=1))
    raw = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    ai = AIMessage(
        content="", id="m1", tool_calls=[{"name": "ls", "args": {}, "id": "c1"}],
        additional_kwargs={"tool_calls": [raw]}, response_metadata={"finish_reason": "tool_calls"},
    )

    async def handler(request: ModelRequest) -> ModelResponse:
        return ModelResponse(result=[ai])

    request = ModelRequest(model=None, messages=[HumanMessage("hi")], runtime=None)  # type: ignore[arg-type]
    out = (await guard.awrap_model_call(request, handler)).result[0]
    assert out.id == "m1" and out.tool_calls == []
    assert "tool_calls" not in out.additional_kwargs
    assert out.response_metadata["finish_reason"] == "stop"
    assert out.content.startswith("[LOOP STOPPED]")
    assert guard._fallback_reasons.entries[0]["cause"] == "m1"


async def test_rereading_a_file_after_each_edit_is_not_a_loop_but_rereading_an_unchanged_one_is(tmp_path: Path) -> None:
    from agentkeel.harness.middleware.read_before_write import ReadBeforeWrite

    path = "/workspace/notes.md"
    edit_cycle = []
    for i in range(6):  # read, edit, read, edit ... : the gate requires every one of these reads
        edit_cycle.append(turn(("read_file", {"path": path})))
        edit_cycle.append(turn(("write_file", {"path": path, "content": f"line {i}\n", "append": True})))
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.md").write_text("start\n")
    out = await run_agent(script(*edit_cycle, {"say": "done"}),
                          [LoopDetection(LoopDetectionLimits()), ReadBeforeWrite()], tmp_path / "ws")
    assert out.codes == [] and not out.journal.kinds("intervention")
    assert (tmp_path / "ws" / "notes.md").read_text().count("line") == 6

    (tmp_path / "ws2").mkdir()
    (tmp_path / "ws2" / "notes.md").write_text("start\n")
    same = [turn(("read_file", {"path": path}), repeat=6), {"say": "done"}]
    out = await run_agent(script(*same), [LoopDetection(LoopDetectionLimits()), ReadBeforeWrite()], tmp_path / "ws2")
    # The first read has no earlier version; reads 2-6 of the unchanged file are identical calls.
    assert out.codes == ["loop_capped"]
