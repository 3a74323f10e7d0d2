"""``benchmarks/gateway.py`` still works: every phase at a tiny size against the shared server.

Only that the phases run and their correctness checks hold (including exact replay) is asserted,
never a speed: timings on a shared test machine prove nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from server_support import KeelServer

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "gateway.py"


def _load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("agentkeel_benchmark_gateway", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "agentkeel_benchmark_gateway", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


async def test_every_phase_runs_and_replay_is_exact(keel_server: KeelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load(monkeypatch)
    results = await bench.measure(keel_server.url, bench.QUICK)
    assert set(results) == {"latency", "throughput", "concurrent", "concurrent_sleep", "replay"}
    assert results["replay"]["exact"] and results["replay"]["repeated_ids"] == 0
    table = bench.report({"agentkeel": results}, bench.QUICK)
    assert "target exact replay: PASS" in table and "custom events/s" in table
