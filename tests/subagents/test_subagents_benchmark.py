"""``benchmarks/subagents.py`` still runs, at a tiny size (never how fast: timings prove nothing here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agentkeel.runtime.checkpoints import mode as mode_module

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "subagents.py"


def test_the_replay_benchmark_compares_guards_on_and_off(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)  # open_runtime freezes it for the process
    spec = importlib.util.spec_from_file_location("agentkeel_benchmark_subagents", BENCHMARK)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)

    max_turns = 8  # above the loop guard's hard limit, so "off" must run longer than "on"
    on, off = bench.main(["--children", "2", "--max-turns", str(max_turns)])
    out = capsys.readouterr().out
    assert "guards on" in out and "guards off" in out and "total tokens" in out
    assert (on.status, off.status) == ("success", "success")
    assert on.child_endings == {"completed/loop_capped": 2}
    assert off.child_endings == {"completed/turn_capped": 2}
    assert off.child_calls == 2 * (max_turns + 1)  # every turn, then one forced final answer
    assert off.total_tokens > on.total_tokens > 0 and on.lead_calls == off.lead_calls == 2
