"""A realistic agent run through a real ``keel serve``: time, CPU, stream bytes and memory.

The run is the scripted ``lead`` agent (strict mode) making 31 model calls: 30 tool turns that
write about 2 KB to a file and then read it back, round-robin over 5 files, then a final answer.
It is started and streamed like a chat UI does (``POST /threads``, then ``POST
/threads/{id}/runs/stream`` with ``--stream-mode``), through one ``keel serve`` child process on
the embedded default (a SQLite file, the memory stream) or on ``--database``. With ``--workers N``
the deployment is one ``keel serve --no-worker`` and N ``keel worker`` processes instead, on
``--database`` (PostgreSQL) and ``--stream`` (Redis, keys under a prefix of their own, deleted
afterwards): the runs' starts then spread over processes, and "server" below means all of them
(CPU and RSS summed).

Phases: one warm-up run, ``--sequential`` runs one after the other, ``--concurrent`` runs at once
(each on its own thread), and with ``--runs N`` a long sequential phase that prints the server's
RSS after every 10 runs (does memory stay flat?). Per phase it prints the per-run wall time, the
time to the first SSE event and to the first graph event (the first frame that is not
``metadata``), the server's CPU per run (user + system, from ``/proc``), SSE bytes per run and
the server's peak RSS (sampled every 20 ms) and RSS at the end of the phase.

Targets (issue 13): peak RSS at 10 concurrent runs <= 200 MiB; RSS after 200 sequential runs
within 40 MiB of RSS after 10; first graph event under 10 concurrent runs no later than 3x the
sequential one.

Run ``python benchmarks/agent_workload.py [--sequential 5] [--concurrent 10] [--runs 200]
[--stream-mode values,messages-tuple] [--database URL] [--workers N [--stream URL]] [--limit KEY=VALUE]``
(Linux: reads ``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))
sys.path.insert(0, str(REPO / "tests" / "load"))
from load_support import delete_redis_keys, start_all, stop_all  # type: ignore[import-not-found]  # noqa: E402
from server_support import start_server  # type: ignore[import-not-found]  # noqa: E402

TOOL_TURNS = 30
FILES = 5
CONTENT_BYTES = 2048
MIB = 1024 * 1024
RSS_TARGET_MIB = 200
RSS_GROWTH_TARGET_MIB = 40
FIRST_GRAPH_EVENT_RATIO = 3.0
ANSWER = "All five files were written and read back."


def lead_script() -> dict[str, Any]:
    """30 tool turns (write a file, read it back; files f0..f4 in turn) and an answer: 31 calls."""
    turns: list[dict[str, Any]] = []
    for pair in range(TOOL_TURNS // 2):
        path = f"/workspace/f{pair % FILES}.txt"
        head = f"turn {{turn}}, file {pair % FILES}\n"
        content = head + "x" * (CONTENT_BYTES - len(head)) + "\n"
        turns.append({"say": f"Writing {path}.", "tool_calls": [{"name": "write_file", "args": {"path": path, "content": content}}],
                      "usage": {"input": 1000, "output": 600}})
        turns.append({"say": f"Reading {path} back.", "tool_calls": [{"name": "read_file", "args": {"path": path}}],
                      "usage": {"input": 1200, "output": 20}})
    turns.append({"say": ANSWER, "usage": {"input": 1500, "output": 12}})
    return {"strict": True, "agents": {"lead": turns}}


def write_config(root: Path, database: str | None, limits: dict[str, Any], stream: dict[str, str] | None = None) -> Path:
    """``stream``: ``stream`` and ``stream_prefix`` settings (a multi-process deployment)."""
    (root / "lead.yaml").write_text(yaml.safe_dump(lead_script(), sort_keys=False))
    config = {
        **(stream or {}),
        "data_dir": str(root / "data"),
        "database": database or f"sqlite:///{root / 'keel.db'}",
        "models": [{"name": "scripted", "use": "scripted", "script": "lead.yaml"}],
        "assistants": [{"assistant_id": "lead", "model": "scripted"}],
        "limits": {"stream_heartbeat_s": 1, **limits},
        "gateway": {"heartbeat_s": 1, "drain_s": 2},
    }
    path = root / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- the server's processes, seen through /proc -----------------------------------------------------
def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        total += next(int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:"))
    return total


class PeakRss:
    """Samples the server's RSS every 20 ms while the phase runs."""

    def __init__(self, pid: list[int]) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- one run ---------------------------------------------------------------------------------------
@dataclass
class RunTimes:
    wall_s: float
    first_event_s: float
    first_graph_event_s: float
    sse_bytes: int
    events: int


async def one_run(http: httpx.AsyncClient, modes: list[str]) -> RunTimes:
    begin = time.perf_counter()
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    body = {"assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "Write and check the files."}]},
            "stream_mode": modes}
    first = first_graph = 0.0
    size = events = 0
    event = ""
    answered = False
    async with http.stream("POST", f"/threads/{thread}/runs/stream", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            size += len(line) + 1
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                now = time.perf_counter() - begin
                events += 1
                first = first or now
                if not first_graph and event not in ("metadata", "error"):
                    first_graph = now
                if event == "error":
                    raise RuntimeError(f"the run failed: {line[:300]}")
                answered = answered or ANSWER in line
    if not answered:
        raise RuntimeError("the run ended without its final answer")
    return RunTimes(time.perf_counter() - begin, first, first_graph, size, events)


@dataclass
class Phase:
    name: str
    runs: list[RunTimes]
    wall_s: float
    cpu_s: float
    peak_rss: int
    end_rss: int


async def phase(http: httpx.AsyncClient, pid: list[int], name: str, runs: int, concurrent: bool, modes: list[str]) -> Phase:
    cpu0 = cpu_s(pid)
    begin = time.perf_counter()
    with PeakRss(pid) as rss:
        if concurrent:
            results = list(await asyncio.gather(*(one_run(http, modes) for _ in range(runs))))
        else:
            results = [await one_run(http, modes) for _ in range(runs)]
    return Phase(name, results, time.perf_counter() - begin, cpu_s(pid) - cpu0, rss.peak, rss_bytes(pid))


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.0f}"


def print_phases(phases: list[Phase]) -> None:
    print(f"{'phase':<16}{'runs':>5}{'wall s':>8}{'run ms':>9}{'1st ev ms':>10}{'1st graph':>10}"
          f"{'CPU ms/run':>11}{'SSE KB/run':>11}{'peak MiB':>9}{'end MiB':>8}")
    for p in phases:
        print(f"{p.name:<16}{len(p.runs):>5}{p.wall_s:>8.2f}{ms([r.wall_s for r in p.runs]):>9}"
              f"{ms([r.first_event_s for r in p.runs]):>10}{ms([r.first_graph_event_s for r in p.runs]):>10}"
              f"{p.cpu_s / len(p.runs) * 1000:>11.0f}{statistics.mean(r.sse_bytes for r in p.runs) / 1024:>11.0f}"
              f"{p.peak_rss / MIB:>9.1f}{p.end_rss / MIB:>8.1f}")
    print("(run ms, 1st ev ms, 1st graph: medians per run; CPU and MiB: the server's processes, user + system)")


async def long_phase(http: httpx.AsyncClient, pid: list[int], runs: int, modes: list[str]) -> tuple[int, int]:
    """Sequential runs, the server's RSS after every 10; returns (RSS after 10, after the last)."""
    after_10 = last = 0
    print(f"\n{runs} sequential runs: server RSS after every 10")
    for index in range(1, runs + 1):
        await one_run(http, modes)
        if index % 10 == 0:
            last = rss_bytes(pid)
            after_10 = after_10 or last
            print(f"  after {index:>4} runs: {last / MIB:7.1f} MiB")
    return after_10, last


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, run the phases, print the tables; the figures, for callers (the smoke test)."""
    modes = [m for m in args.stream_mode.split(",") if m]
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="keel-agent-bench-") as tmp:
        extra = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.limit)}
        async with deployment(Path(tmp), args, extra) as (url, pid):
            print(f"{deployed(args)}, pids {pid}, RSS {rss_bytes(pid) / MIB:.1f} MiB at start; {TOOL_TURNS + 1} model calls per run "
                  f"({TOOL_TURNS // 2} writes of {CONTENT_BYTES} B + {TOOL_TURNS // 2} reads, {FILES} files), "
                  f"stream_mode {modes}; load average {os.getloadavg()[0]:.2f}")
            limits = httpx.Limits(max_connections=args.concurrent + 10)
            async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
                await one_run(http, modes)  # warm-up: imports, statement compilation, first checkpoint
                phases = [await phase(http, pid, "sequential", args.sequential, False, modes),
                          await phase(http, pid, "concurrent", args.concurrent, True, modes)]
                print_phases(phases)
                seq, conc = phases
                ratio = (statistics.median(r.first_graph_event_s for r in conc.runs)
                         / statistics.median(r.first_graph_event_s for r in seq.runs))
                ok = conc.peak_rss / MIB <= RSS_TARGET_MIB
                verdict = "n/a: the target is one keel serve's" if args.workers else "met" if ok else "MISSED"
                print(f"peak RSS at {args.concurrent} concurrent: {conc.peak_rss / MIB:.1f} MiB "
                      f"(target <= {RSS_TARGET_MIB}): {verdict}")
                print(f"first graph event, concurrent/sequential: {ratio:.2f}x "
                      f"(target <= {FIRST_GRAPH_EVENT_RATIO}x): {'met' if ratio <= FIRST_GRAPH_EVENT_RATIO else 'MISSED'}")
                result = {"phases": phases, "first_graph_event_ratio": ratio}
                if args.runs >= 10:
                    after_10, after_all = await long_phase(http, pid, args.runs, modes)
                    growth = (after_all - after_10) / MIB
                    print(f"RSS growth from run 10 to run {args.runs}: {growth:+.1f} MiB "
                          f"(target within {RSS_GROWTH_TARGET_MIB}): {'met' if abs(growth) <= RSS_GROWTH_TARGET_MIB else 'MISSED'}")
                    result["rss_growth_mib"] = growth
            print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return result


def deployed(args: argparse.Namespace) -> str:
    if args.workers:
        return f"keel serve --no-worker + {args.workers} keel worker"
    return "keel serve"


@contextlib.asynccontextmanager
async def deployment(root: Path, args: argparse.Namespace, limits: dict[str, Any]) -> AsyncIterator[tuple[str, list[int]]]:
    """The server's URL and the pids of its processes, stopped on the way out."""
    if not args.workers:
        server = start_server(write_config(root, args.database, limits))
        try:
            yield server.url, [server.pid]
        finally:
            server.stop()
        return
    prefix = f"keel-aw-{uuid.uuid4().hex[:8]}"
    config = write_config(root, args.database, limits, {"stream": args.stream, "stream_prefix": prefix})
    workers, gateways = await start_all(config, args.workers, 1)
    try:
        yield gateways[0].url, [p.pid for p in (*gateways, *workers)]
    finally:
        stop_all([*gateways, *workers])
        await delete_redis_keys(args.stream, prefix)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--runs", type=int, default=0, help="a long sequential phase printing RSS every 10 runs")
    parser.add_argument("--stream-mode", default="values,messages-tuple")
    parser.add_argument("--database", default=None, help="default: a SQLite file in a temp dir")
    parser.add_argument("--workers", type=int, default=0,
                        help="N > 0: keel serve --no-worker + N keel worker processes (needs a PostgreSQL --database)")
    parser.add_argument("--stream", default="redis://127.0.0.1:6379/0", help="the stream of a --workers deployment")
    parser.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                        help="a `limits:` setting of the server, e.g. stream_max_bytes=1048576 (repeatable)")
    args = parser.parse_args(argv)
    if args.workers and not (args.database or "").startswith("postgresql"):
        parser.error("--workers needs a PostgreSQL --database (processes share it)")
    return asyncio.run(measure(args))


if __name__ == "__main__":
    main()
