"""The load test's invariant checks catch what they claim to (no processes here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from load_support import JournalRow, overlaps, running_intervals, seq_problems

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(run: str, seq: int, kind: str, at: float, thread: str = "t", **data: object) -> JournalRow:
    return JournalRow(run, thread, seq, kind, dict(data), T0 + timedelta(seconds=at))


def test_a_lost_attempt_ends_at_its_recovery_and_the_new_attempt_continues() -> None:
    rows = [row("a", 1, "run.start", 0, attempt=1), row("a", 2, "run.recovered", 5, lost_attempt=1, attempt=2),
            row("a", 3, "run.start", 5.1, attempt=2), row("a", 4, "run.end", 6)]
    spans = sorted((i.attempt, (i.start - T0).total_seconds(), (i.end - T0).total_seconds())
                   for i in running_intervals(rows) if i.end)
    assert spans == [(1, 0, 5), (2, 5, 6)]
    assert overlaps(running_intervals(rows)) == []  # one run may hand over to itself


def test_an_attempt_nothing_ended_stays_open_and_overlaps_what_follows() -> None:
    rows = [row("a", 1, "run.start", 0, attempt=1), row("b", 1, "run.start", 9, attempt=1), row("b", 2, "run.end", 10)]
    intervals = running_intervals(rows)
    assert [i.run_id for i in intervals if i.end is None] == ["a"]
    assert [(x.run_id, y.run_id) for x, y in overlaps(intervals)] == [("a", "b")]


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 10)), min_size=1, max_size=8))
def test_overlaps_finds_exactly_the_runs_that_share_the_thread(spans: list[tuple[int, int]]) -> None:
    rows = []
    for n, (start, length) in enumerate(spans):
        rows += [row(f"r{n}", 1, "run.start", start, attempt=1), row(f"r{n}", 2, "run.end", start + length)]
    expected = any(a[0] < b[0] + b[1] and b[0] < a[0] + a[1] for i, a in enumerate(spans) for b in spans[i + 1:])
    assert bool(overlaps(running_intervals(rows))) == expected


def test_seq_problems_names_duplicates_and_holes() -> None:
    rows = [row("a", 1, "x", 0), row("a", 2, "x", 0), row("b", 1, "x", 0), row("b", 1, "x", 0), row("b", 3, "x", 0)]
    assert set(seq_problems(rows)) == {"b"}
    assert "duplicates [1]" in seq_problems(rows)["b"] and "holes [2]" in seq_problems(rows)["b"]
