"""What the console's reads cost: a run page's timeline, the runs list and a ``/metrics`` scrape.

The run page reloads its timeline after stream events (at most one every 0.4 s while a run is
live), so the timeline of a long run must stay cheap. This script records one scripted run of
``--turns`` model turns on the embedded default (SQLite, memory stream) that edits one file with
``str_replace`` again and again (every other turn reads it first, as read-before-write asks), so
the journal, the waterfall and the file's replayed step diffs all grow with the run; and
``--runs`` short runs for the list. Then it times the three reads through the gateway app
in-process (``httpx.ASGITransport``; no network), ``--repeat`` times each, and prints the best and
median wall time and the answer's size.

    .venv/bin/python benchmarks/console.py                 # 200 turns, 50 list runs, 20 reads each
    .venv/bin/python benchmarks/console.py --turns 500 --repeat 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from agentkeel.config import KeelConfig
from agentkeel.gateway.app import create_app
from agentkeel.runtime.runtime import open_runtime

LIFTED = 1_000_000
FILE = "/workspace/notes.md"


def script(turns: int) -> dict[str, object]:
    first = {"say": "Start.", "tool_calls": [{"name": "write_file", "args": {"path": FILE, "content": "v0\n"}}],
             "usage": {"input": 100, "output": 10}}
    edits = []
    for n in range(1, (turns - 1) // 2 + 1):  # read-before-write wants a read before each edit
        edits.append({"say": f"Read {n}.", "usage": {"input": 100 + n, "output": 5},
                      "tool_calls": [{"name": "read_file", "args": {"path": FILE}}]})
        edits.append({"say": f"Edit {n}.", "usage": {"input": 100 + n, "output": 10},
                      "tool_calls": [{"name": "str_replace", "args": {"path": FILE, "old": f"v{n - 1}\n", "new": f"v{n}\n"}}]})
    return {"strict": True, "agents": {"lead": [first, *edits, {"say": "Done."}]}}


def bench_config(root: Path, turns: int) -> KeelConfig:
    path = root / "script.yaml"
    path.write_text(yaml.safe_dump(script(turns), sort_keys=False))
    short = root / "short.yaml"
    short.write_text(yaml.safe_dump({"agents": {"lead": [{"say": "ok", "usage": {"input": 5, "output": 1}}]}}))
    limit = 2 * turns + 20
    return KeelConfig(
        data_dir=str(root / "data"), base_dir=root,
        models=[{"name": "long", "use": "scripted", "script": str(path)},
                {"name": "short", "use": "scripted", "script": str(short)}],
        limits={"recursion_limit": limit, "max_recursion_limit": max(1000, limit),
                "loop_detection": {"tool_freq_warn": LIFTED, "tool_freq_hard_limit": LIFTED},
                "turn_limit": {"max_turns": turns + 10}, "token_budget": {"max_tokens": 1_000_000_000},
                "tool_progress": {"stagnation_threshold": LIFTED}},
    )


@dataclass(frozen=True)
class Measured:
    read: str
    best_ms: float
    median_ms: float
    kib: float


async def _wait(http: httpx.AsyncClient, model: str) -> tuple[str, str]:
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    answer = await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "lead", "input": "go", "context": {"model_name": model}})
    assert answer.status_code == 200, answer.text
    run = (await http.get(f"/threads/{thread}/runs")).json()[0]
    assert run["status"] == "success", run
    return thread, run["run_id"]


async def measure(turns: int, runs: int, repeat: int) -> tuple[list[Measured], dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        async with open_runtime(bench_config(Path(tmp), turns)) as runtime:
            transport = httpx.ASGITransport(app=create_app(runtime))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=300) as http:
                thread, run_id = await _wait(http, "long")
                for _ in range(runs):
                    await _wait(http, "short")
                reads = {
                    "timeline, later reads": f"/console/api/threads/{thread}/runs/{run_id}/timeline",
                    f"runs list (limit 50 of {runs + 1})": "/console/api/runs",
                    "/metrics": "/metrics",
                }
                began = time.perf_counter()
                first = await http.get(reads["timeline, later reads"])
                # The first read of a run lists all its checkpoints; later ones only newer ones.
                rows = [Measured("timeline, first read", *[(time.perf_counter() - began) * 1000] * 2, len(first.content) / 1024)]
                doc = first.json()
                sizes = {"journal records": doc["last_seq"], "checkpoints": doc["checkpoints"], "waterfall rows": len(doc["steps"]),
                         "file steps": sum(len(c["steps"]) for c in doc["changes"]),
                         "verified steps": sum(bool(s["verified"]) for c in doc["changes"] for s in c["steps"])}
                for name, path in reads.items():
                    times, size = [], 0
                    for _ in range(repeat):
                        began = time.perf_counter()
                        answer = await http.get(path)
                        times.append((time.perf_counter() - began) * 1000)
                        assert answer.status_code == 200, answer.text
                        size = len(answer.content)
                    rows.append(Measured(name, min(times), statistics.median(times), size / 1024))
                return rows, sizes


def report(rows: list[Measured], sizes: dict[str, int], turns: int, repeat: int) -> None:
    print(f"console reads, {turns}-turn run, {repeat} reads each (in-process, SQLite)")
    print(", ".join(f"{name}: {value}" for name, value in sizes.items()))
    print(f"{'read':<32} {'best ms':>9} {'median ms':>10} {'KiB':>8}")
    for row in rows:
        print(f"{row.read:<32} {row.best_ms:>9.1f} {row.median_ms:>10.1f} {row.kib:>8.1f}")


def main(argv: list[str] | None = None) -> list[Measured]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    rows, sizes = asyncio.run(measure(args.turns, args.runs, args.repeat))
    report(rows, sizes, args.turns, args.repeat)
    return rows


if __name__ == "__main__":
    main()
