"""UsageAccumulator: dedupe, caller classes, per-model and per-agent tallies, the run resource shape."""

from __future__ import annotations

import threading

import pytest

from agentkeel.runtime.usage import UsageAccumulator, caller_class, caller_from_tags


@pytest.mark.parametrize(
    ("tags", "caller"),
    [
        (None, "lead"),
        ([], "lead"),
        (["seq:step:1", "graph:step"], "lead"),
        (["lead"], "lead"),
        (["subagent:research"], "subagent:research"),
        (["middleware:summarization", "x"], "middleware:summarization"),
        # Inherited tags come first: the innermost (last) caller tag is the one that made the call.
        (["lead", "subagent:research"], "subagent:research"),
        (["lead", "subagent:research", "middleware:title"], "middleware:title"),
        (["leader", "subagents"], "lead"),
    ],
)
def test_caller_from_tags(tags: list[str] | None, caller: str) -> None:
    assert caller_from_tags(tags) == caller


def test_caller_class() -> None:
    assert caller_class("lead") == "lead"
    assert caller_class("subagent:general") == "subagent"
    assert caller_class("middleware:title") == "middleware"
    assert caller_class("something-else") == "lead"


def test_as_dict_shape_and_totals() -> None:
    usage = UsageAccumulator()
    assert usage.add("lead", "gpt", 100, 10, source_id="a")
    assert usage.add("subagent:research", "gpt", 1000, 20, source_id="b")
    assert usage.add("subagent:code", "small", 500, 5, source_id="c")
    assert usage.add("middleware:summarization", "small", 50, 7)
    out = usage.as_dict()
    assert set(out) == {"input_tokens", "output_tokens", "total_tokens", "by_caller", "by_model", "by_agent"}
    assert (out["input_tokens"], out["output_tokens"], out["total_tokens"]) == (1650, 42, 1692)
    assert usage.total_tokens == 1692
    assert out["by_caller"] == {
        "lead": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110, "calls": 1},
        "subagent": {"input_tokens": 1500, "output_tokens": 25, "total_tokens": 1525, "calls": 2},
        "middleware": {"input_tokens": 50, "output_tokens": 7, "total_tokens": 57, "calls": 1},
    }
    assert out["by_model"] == {
        "gpt": {"input_tokens": 1100, "output_tokens": 30, "total_tokens": 1130, "calls": 2},
        "small": {"input_tokens": 550, "output_tokens": 12, "total_tokens": 562, "calls": 2},
    }
    assert set(out["by_agent"]) == {"lead", "subagent:research", "subagent:code", "middleware:summarization"}
    assert out["by_agent"]["subagent:code"]["total_tokens"] == 505


def test_empty_usage_has_every_caller_bucket() -> None:
    out = UsageAccumulator().as_dict()
    assert out["total_tokens"] == 0
    assert set(out["by_caller"]) == {"lead", "subagent", "middleware"}
    assert out["by_model"] == {} and out["by_agent"] == {}


def test_source_id_is_counted_once() -> None:
    usage = UsageAccumulator()
    assert usage.add("lead", "m", 10, 1, source_id="run-1")
    assert not usage.add("subagent:x", "m", 10, 1, source_id="run-1")
    assert usage.add("lead", "m", 10, 1)  # no source id: never deduplicated
    assert usage.as_dict()["by_model"]["m"]["calls"] == 2


def test_missing_or_negative_counts_are_zero_and_model_defaults() -> None:
    usage = UsageAccumulator()
    usage.add("lead", "", None, -5)
    out = usage.as_dict()
    assert out["total_tokens"] == 0
    assert out["by_model"]["unknown"]["calls"] == 1


def test_concurrent_adds_are_not_lost() -> None:
    usage = UsageAccumulator()

    def work(n: int) -> None:
        for i in range(1000):
            usage.add(f"subagent:{n}", "m", 1, 1, source_id=f"{n}-{i % 500}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = usage.as_dict()
    assert out["by_caller"]["subagent"]["calls"] == 8 * 500
    assert out["total_tokens"] == 8 * 500 * 2
