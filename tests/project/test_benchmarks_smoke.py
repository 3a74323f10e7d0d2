"""The benchmarks still run: each script end to end at a tiny size.

Only that the code works is checked (every variant runs, its checks of the run hold, the report
prints), never how fast: timings on a shared test machine prove nothing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from agentkeel.runtime.checkpoints import mode as mode_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import a benchmark script by path (``benchmarks/`` is not a package)."""
    module_name = f"agentkeel_benchmark_{name}"
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module_name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_run_overhead_at_five_steps(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # open_runtime freezes the checkpoint mode for the process; undo that when the test ends.
    monkeypatch.setattr(mode_module, "_frozen", None)
    bench = _load("run_overhead", monkeypatch)
    result = bench.main(
        ["--steps", "5", "--repeat", "1", "--breakdown", "always", "--bytes-messages", "10", "--profile"]
    )
    out = capsys.readouterr().out
    for expected in ("ratio runtime/bare", "where the extra time goes", "checkpoint bytes", "cProfile"):
        assert expected in out, out
    variants = bench.HEADLINE + bench.BREAKDOWN
    assert set(result["results"]) == {v.key for v in variants}
    assert all(len(s.samples) == 1 and s.wall_ms > 0 for s in result["results"].values())
    assert result["ratio"] > 0
    assert [row["mode"] for row in result["checkpoint_bytes"]] == ["full", "delta"]
    assert all(row["messages"] == 10 and row["total_bytes"] > 0 for row in result["checkpoint_bytes"])


def test_checkpoint_bytes_runs_at_a_tiny_size(monkeypatch: pytest.MonkeyPatch) -> None:
    row = _load("checkpoint_bytes", monkeypatch).measure_checkpoint_bytes("full", 6, message_chars=50)
    assert row["steps"] == 3 and len(row["per_step"]) == 3 and row["total_bytes"] > 0


def test_chain_overhead_runs_at_a_tiny_size(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load("chain_overhead", monkeypatch)
    result = bench.main(["--steps", "3", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "chain cost in repair mode" in out and "without chain" in out
    assert set(result) == {"per_step_ms", *(f"cost_{name}" for name in bench.VARIANTS)}


@pytest.mark.postgres
@pytest.mark.redis
def test_workers_runs_at_a_tiny_size(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _load("workers", monkeypatch)
    # Any database on the server will do to create the scratch databases from.
    results = bench.main(["--runs", "6", "--threads", "3", "--probes", "2", "--pg-admin", pg_url, "--redis", redis_url])
    out = capsys.readouterr().out
    assert "runs/s with 2 workers / with 1" in out and "start lag p50 ms" in out
    assert [r["workers"] for r in results] == [1, 2]
    for result in results:
        assert result["statuses"] == {"success"} and result["runs_per_s"] > 0
        assert len(result["first_event_ms"]) == 2 and len(result["start_lag_ms"]) == 6


@pytest.mark.postgres
def test_stores_runs_at_a_tiny_size(pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    bench = _load("stores", monkeypatch)
    results = bench.main(["--steps", "2", "--sequential", "1", "--concurrent", "2", "--short", "3", "--rounds", "1",
                          "--pg-admin", pg_url])
    out = capsys.readouterr().out
    assert "postgres / sqlite per run" in out and "embedded (sqlite) / memory://" in out
    assert set(results) == {"sqlite", "postgres", "memory"}
    for result in results.values():
        assert len(result.sequential) == 1 and len(result.concurrent) == 2 and result.short_wall_ms > 0
        assert all(t.first_graph_ms <= t.run_ms for t in result.sequential + result.concurrent)


def test_context_runs_at_a_tiny_size(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    runs = _load("context", monkeypatch).main(["--turns", "12", "--every", "4", "--trigger", "8", "--keep", "4"])
    out = capsys.readouterr().out
    assert "no compaction" in out and "checkpoint bytes/turn" in out and "summary calls" in out, out
    assert set(runs) == {"plain", "full", "delta"}
    assert runs["full"].summaries and not runs["plain"].summaries  # compaction happened, and only where on
    assert max(r.messages for r in runs["full"].lead) <= 9 < max(r.messages for r in runs["plain"].lead)


def test_console_reads_at_five_turns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    bench = _load("console", monkeypatch)
    rows = bench.main(["--turns", "5", "--runs", "2", "--repeat", "1"])
    out = capsys.readouterr().out
    assert [row.read for row in rows] == ["timeline, first read", "timeline, later reads", "runs list (limit 50 of 3)", "/metrics"]
    assert "file steps: 3, verified steps: 3" in out  # the write and two replayed edits, each hash-checked


def test_agent_workload_runs_at_a_tiny_size(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load("agent_workload", monkeypatch)
    result = bench.main(["--sequential", "1", "--concurrent", "2", "--stream-mode", "values"])
    out = capsys.readouterr().out
    assert "peak RSS at 2 concurrent" in out and "first graph event" in out
    sequential, concurrent = result["phases"]
    assert len(sequential.runs) == 1 and len(concurrent.runs) == 2
    assert all(r.sse_bytes > 0 and 0 < r.first_event_s <= r.first_graph_event_s <= r.wall_s
               for p in result["phases"] for r in p.runs)
    assert concurrent.peak_rss > 0 and concurrent.cpu_s > 0


@pytest.mark.postgres
@pytest.mark.redis
def test_agent_workload_with_worker_processes_at_a_tiny_size(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _load("agent_workload", monkeypatch)
    scratch = _load("workers", monkeypatch).scratch_database
    name = f"keel_aw_{uuid.uuid4().hex[:10]}"
    database = asyncio.run(scratch(pg_url, name, True))
    try:
        result = bench.main(["--sequential", "1", "--concurrent", "2", "--stream-mode", "values",
                             "--workers", "2", "--database", database, "--stream", redis_url])
    finally:
        asyncio.run(scratch(pg_url, name, False))
    out = capsys.readouterr().out
    assert "keel serve --no-worker + 2 keel worker" in out and "first graph event" in out
    sequential, concurrent = result["phases"]
    assert len(sequential.runs) == 1 and len(concurrent.runs) == 2
    assert concurrent.cpu_s > 0  # summed over the gateway and both workers
