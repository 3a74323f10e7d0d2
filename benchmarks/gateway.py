"""Gateway speed on loopback: ``keel serve`` and, when installed, the official LangGraph server.

Both servers serve the same ``graphs.py`` (``tests/gateway/server_support.py``: ``echo`` runs
``steps`` supersteps, each writing ``custom`` custom events, sleeping ``delay`` s and appending one
AI message) and are driven by the same plain httpx client with a minimal SSE reader, one server
at a time, so the numbers compare servers and not clients. Measured:

a. a one-step run: time to the first SSE event (the ``metadata`` frame), to the first graph event,
   to the end of the stream; and the ``POST /runs/wait`` round trip (median of ``--reps``);
b. one run emitting ``--events`` custom events in one superstep (events/s from request to end of
   stream), and one run of ``--supersteps`` supersteps with checkpoints (``updates``, time and
   events/s) — medians of ``--heavy-reps``;
c. ``--concurrent`` runs on as many threads at once, without and with a 3 x 0.2 s sleep per run
   (wall time, per-run median and p90);
d. a ``--replay``-event resumable run, rejoined with ``Last-Event-ID`` of event ``replay/2``:
   events received vs expected, anything received twice or missing, and ids the run repeated.

The official server is never a dependency of AgentKeel. Point ``--official-cli`` (or
``$LANGGRAPH_CLI``) at a ``langgraph`` executable from a separate environment with
``langgraph-cli[inmem]`` installed; it is started offline (no analytics, no version check, no
LangSmith) as ``langgraph dev`` on a free port. Without it only AgentKeel's column is printed.

Targets: first event under 50 ms; at least twice the official server's custom events/s; exact
replay (every expected event once, nothing else).

AgentKeel runs on a SQLite file by default (its out-of-the-box setup); ``--database memory://``
compares like with like against the official in-memory runtime.

Run ``python benchmarks/gateway.py [--official-cli PATH] [--database URL] [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))
from server_support import LANGGRAPH_JSON, free_port, start_server, write_project  # type: ignore[import-not-found]  # noqa: E402

FIRST_EVENT_TARGET_MS = 50.0
THROUGHPUT_TARGET_RATIO = 2.0
PHASE_TIMEOUT_S = 300.0
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LANGSMITH_TRACING": "false",
    "LANGGRAPH_DISABLE_FILE_PERSISTENCE": "true",
    "LOG_LEVEL": "WARNING",
}
SECRET_ENV = ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "LANGGRAPH_API_KEY", "LANGGRAPH_CLOUD_LICENSE_KEY")


@dataclass(frozen=True)
class Sizes:
    reps: int = 25
    heavy_reps: int = 3
    events: int = 2000
    supersteps: int = 500
    concurrent: int = 50
    replay: int = 1000
    replay_reps: int = 5


QUICK = Sizes(reps=3, heavy_reps=1, events=100, supersteps=20, concurrent=5, replay=40, replay_reps=2)


# -- servers ---------------------------------------------------------------------------------------
@dataclass
class Server:
    name: str
    url: str
    stop: Callable[[], Any]


@contextlib.contextmanager
def agentkeel_server(root: Path, database: str | None = None) -> Iterator[Server]:
    """``keel serve`` on a SQLite file in ``root`` (the embedded default), or on ``database``."""
    server = start_server(write_project(root / "agentkeel", database=database))
    try:
        yield Server("agentkeel", server.url, server.stop)
    finally:
        server.stop()


@contextlib.contextmanager
def official_server(cli: str, root: Path) -> Iterator[Server]:
    """``langgraph dev`` on the same graphs, offline; stopped by its PID."""
    project = root / "official"
    write_project(project)  # the graphs (its keel.yaml is unused)
    (project / "langgraph.json").write_text(json.dumps(LANGGRAPH_JSON))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV} | OFFLINE_ENV
    log = (project / "official.log").open("wb")
    command = [cli, "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port),
               "--n-jobs-per-worker", "50", "--server-log-level", "WARNING"]
    process = subprocess.Popen(command, cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        log.close()

    try:
        _wait_ok(f"http://127.0.0.1:{port}", process, project / "official.log")
        yield Server("official", f"http://127.0.0.1:{port}", stop)
    finally:
        stop()


def _wait_ok(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=2) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the official server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/ok").status_code == 200:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"the official server did not answer /ok within {timeout:g} s")


# -- a minimal SSE client --------------------------------------------------------------------------
@dataclass
class Frame:
    event: str
    data: Any
    id: str | None
    at: float  # perf_counter when the frame was complete


@dataclass
class StreamResult:
    frames: list[Frame] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    run_id: str = ""

    def first(self, *names: str) -> float:
        return next(f.at for f in self.frames if not names or f.event in names) - self.started

    def count(self, name: str) -> int:
        return sum(1 for f in self.frames if f.event == name)


async def read_stream(http: httpx.AsyncClient, method: str, path: str, *, json_body: Any = None,
                      headers: dict[str, str] | None = None) -> StreamResult:
    result = StreamResult(started=time.perf_counter())
    event, event_id = "", None
    data: list[str] = []
    async with http.stream(method, path, json=json_body, headers=headers) as response:
        response.raise_for_status()
        location = response.headers.get("content-location", "")
        result.run_id = location.rsplit("/", 1)[-1] if location else ""
        async for line in response.aiter_lines():
            if not line:
                if data:
                    result.frames.append(Frame(event or "message", json.loads("\n".join(data)), event_id, time.perf_counter()))
                event, data = "", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value
    result.ended = time.perf_counter()
    if not result.run_id and result.frames and result.frames[0].event == "metadata":
        result.run_id = result.frames[0].data["run_id"]
    return result


async def new_thread(http: httpx.AsyncClient) -> str:
    response = await http.post("/threads", json={})
    response.raise_for_status()
    return str(response.json()["thread_id"])


def echo(input: dict[str, Any], modes: list[str], **extra: Any) -> dict[str, Any]:
    return {"assistant_id": "echo", "input": input, "stream_mode": modes, **extra}


def ms(seconds: float) -> float:
    return seconds * 1000.0


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


# -- phases ----------------------------------------------------------------------------------------
async def latency(http: httpx.AsyncClient, reps: int) -> dict[str, float]:
    floor, first, graph, end, wait = [], [], [], [], []
    for _ in range(reps):
        begin = time.perf_counter()
        tid = await new_thread(http)
        floor.append(time.perf_counter() - begin)
        run = await read_stream(http, "POST", f"/threads/{tid}/runs/stream", json_body=echo({"steps": 1}, ["values"]))
        first.append(run.first())
        graph.append(run.first("values"))
        end.append(run.ended - run.started)
        tid = await new_thread(http)
        begin = time.perf_counter()
        response = await http.post(f"/threads/{tid}/runs/wait", json=echo({"steps": 1}, ["values"]))
        assert response.json()["done"] == 1, response.text
        wait.append(time.perf_counter() - begin)
    return {
        "http_floor_ms": ms(statistics.median(floor)),
        "first_event_ms": ms(statistics.median(first)),
        "first_graph_event_ms": ms(statistics.median(graph)),
        "stream_end_ms": ms(statistics.median(end)),
        "wait_round_trip_ms": ms(statistics.median(wait)),
    }


async def throughput(http: httpx.AsyncClient, events: int, supersteps: int, reps: int) -> dict[str, float]:
    custom_rate, custom_time, step_rate, step_time = [], [], [], []
    for _ in range(reps):
        tid = await new_thread(http)
        run = await read_stream(http, "POST", f"/threads/{tid}/runs/stream",
                                json_body=echo({"steps": 1, "custom": events}, ["custom"]))
        assert run.count("custom") == events, f"{run.count('custom')} of {events} custom events"
        custom_time.append(run.ended - run.started)
        custom_rate.append(events / custom_time[-1])
        tid = await new_thread(http)
        run = await read_stream(http, "POST", f"/threads/{tid}/runs/stream",
                                json_body=echo({"steps": supersteps}, ["updates"],
                                               config={"recursion_limit": supersteps * 2 + 10}))
        assert run.count("updates") == supersteps, f"{run.count('updates')} of {supersteps} updates"
        step_time.append(run.ended - run.started)
        step_rate.append(supersteps / step_time[-1])
    return {
        "custom_run_s": statistics.median(custom_time),
        "custom_events_per_s": statistics.median(custom_rate),
        "supersteps_run_s": statistics.median(step_time),
        "supersteps_events_per_s": statistics.median(step_rate),
    }


async def concurrency(http: httpx.AsyncClient, runs: int, delay: float) -> dict[str, float]:
    threads = [await new_thread(http) for _ in range(runs)]
    body = echo({"steps": 3, "delay": delay}, ["values"])

    async def one(tid: str) -> float:
        begin = time.perf_counter()
        response = await http.post(f"/threads/{tid}/runs/wait", json=body)
        assert response.json()["done"] == 3, response.text
        return time.perf_counter() - begin

    begin = time.perf_counter()
    durations = await asyncio.gather(*(one(t) for t in threads))
    wall = time.perf_counter() - begin
    return {"wall_s": wall, "median_s": statistics.median(durations), "p90_s": p90(list(durations))}


async def replay(http: httpx.AsyncClient, events: int, reps: int) -> dict[str, Any]:
    half = events // 2
    expected = set(range(half, events))
    trials: list[dict[str, Any]] = []
    for _ in range(reps):
        tid = await new_thread(http)
        run = await read_stream(http, "POST", f"/threads/{tid}/runs/stream",
                                json_body=echo({"steps": 1, "custom": events}, ["custom"], stream_resumable=True))
        custom = [f for f in run.frames if f.event == "custom"]
        assert len(custom) == events, f"{len(custom)} of {events}"
        ids = [f.id for f in run.frames if f.id is not None]
        cursor = custom[half - 1].id
        assert cursor is not None, "the server sent no event ids"
        path = f"/threads/{tid}/runs/{run.run_id}/stream"
        rest = await read_stream(http, "GET", path, headers={"Last-Event-ID": cursor})
        got = [f.data["j"] for f in rest.frames if f.event == "custom"]
        counts = Counter(got)
        full = await read_stream(http, "GET", path, headers={"Last-Event-ID": "0-0"})
        trials.append({
            "received": len(got),
            "missing": len(expected - counts.keys()),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1) + sum(1 for j in got if j not in expected),
            "repeated_ids": len(ids) - len(set(ids)),
            "replay_ms": ms(rest.ended - rest.started),
            "full_replay_ms": ms(full.ended - full.started),
            "full_replay_events": full.count("custom"),
        })
    return {
        "expected": len(expected),
        "received": [t["received"] for t in trials],
        "missing": sum(t["missing"] for t in trials),
        "duplicates": sum(t["duplicates"] for t in trials),
        "repeated_ids": max(t["repeated_ids"] for t in trials),
        "replay_ms": statistics.median(t["replay_ms"] for t in trials),
        "full_replay_ms": statistics.median(t["full_replay_ms"] for t in trials),
        "exact": all(t["missing"] == 0 and t["duplicates"] == 0 and t["full_replay_events"] == events for t in trials),
    }


async def measure(url: str, sizes: Sizes) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=sizes.concurrent + 10, max_keepalive_connections=sizes.concurrent + 10)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10), limits=limits) as http:
        await latency(http, 2)  # warm-up: imports, connections, first-run caches
        out: dict[str, Any] = {}
        out["latency"] = await asyncio.wait_for(latency(http, sizes.reps), PHASE_TIMEOUT_S)
        out["throughput"] = await asyncio.wait_for(
            throughput(http, sizes.events, sizes.supersteps, sizes.heavy_reps), PHASE_TIMEOUT_S)
        out["concurrent"] = await asyncio.wait_for(concurrency(http, sizes.concurrent, 0.0), PHASE_TIMEOUT_S)
        out["concurrent_sleep"] = await asyncio.wait_for(concurrency(http, sizes.concurrent, 0.2), PHASE_TIMEOUT_S)
        out["replay"] = await asyncio.wait_for(replay(http, sizes.replay, sizes.replay_reps), PHASE_TIMEOUT_S)
        return out


# -- report ----------------------------------------------------------------------------------------
# (label, section, key, unit, higher is better)
ROWS: list[tuple[str, str, str, str, bool]] = [
    ("a. POST /threads (HTTP floor)", "latency", "http_floor_ms", "ms", False),
    ("a. one-step stream: first SSE event", "latency", "first_event_ms", "ms", False),
    ("a. ... first graph event", "latency", "first_graph_event_ms", "ms", False),
    ("a. ... end of stream", "latency", "stream_end_ms", "ms", False),
    ("a. POST .../runs/wait round trip", "latency", "wait_round_trip_ms", "ms", False),
    ("b. {events} custom events: run time", "throughput", "custom_run_s", "s", False),
    ("b. ... custom events/s", "throughput", "custom_events_per_s", "/s", True),
    ("b. {supersteps} supersteps (updates): run time", "throughput", "supersteps_run_s", "s", False),
    ("b. ... supersteps/s", "throughput", "supersteps_events_per_s", "/s", True),
    ("c. {concurrent} concurrent runs: wall", "concurrent", "wall_s", "s", False),
    ("c. ... per run median", "concurrent", "median_s", "s", False),
    ("c. ... per run p90", "concurrent", "p90_s", "s", False),
    ("c. {concurrent} concurrent, 3 x 0.2 s sleep: wall", "concurrent_sleep", "wall_s", "s", False),
    ("c. ... per run median", "concurrent_sleep", "median_s", "s", False),
    ("c. ... per run p90", "concurrent_sleep", "p90_s", "s", False),
    ("d. replay after #{half} of {replay}: time", "replay", "replay_ms", "ms", False),
    ("d. full replay from 0-0: time", "replay", "full_replay_ms", "ms", False),
]


def _fmt(value: float, unit: str) -> str:
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "ms":
        return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"
    return f"{value:,.2f} s"


def report(results: dict[str, dict[str, Any]], sizes: Sizes) -> str:
    names = list(results)
    labels = {"events": sizes.events, "supersteps": sizes.supersteps, "concurrent": sizes.concurrent,
              "replay": sizes.replay, "half": sizes.replay // 2}
    header = ["metric", *names] + (["AgentKeel advantage"] if len(names) == 2 else [])
    rows = []
    for label, section, key, unit, higher in ROWS:
        values = [results[n][section][key] for n in names]
        row = [label.format(**labels), *(_fmt(v, unit) for v in values)]
        if len(names) == 2:
            ours, theirs = values
            ratio = (ours / theirs if higher else theirs / ours) if min(values) > 0 else float("nan")
            row.append(f"{ratio:,.1f}x")
        rows.append(row)
    replay_row = ["d. received / expected per trial"]
    dup_row = ["d. missing / duplicated / repeated ids"]
    for name in names:
        r = results[name]["replay"]
        replay_row.append(",".join(map(str, r["received"])) + f" / {r['expected']}")
        dup_row.append(f"{r['missing']} / {r['duplicates']} / {r['repeated_ids']}")
    if len(names) == 2:
        replay_row.append("")
        dup_row.append("")
    rows += [replay_row, dup_row]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[Any]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows), ""]
    ours = results["agentkeel"]
    first = ours["latency"]["first_event_ms"]
    out.append(f"target first event < {FIRST_EVENT_TARGET_MS:g} ms: {'PASS' if first < FIRST_EVENT_TARGET_MS else 'FAIL'} ({first:.1f} ms)")
    if "official" in results:
        ratio = ours["throughput"]["custom_events_per_s"] / results["official"]["throughput"]["custom_events_per_s"]
        verdict = "PASS" if ratio >= THROUGHPUT_TARGET_RATIO else "FAIL"
        out.append(f"target custom events/s >= {THROUGHPUT_TARGET_RATIO:g}x official: {verdict} ({ratio:.1f}x)")
    else:
        out.append("target custom events/s >= 2x official: not measured (no official server; --official-cli / $LANGGRAPH_CLI)")
    out.append(f"target exact replay: {'PASS' if ours['replay']['exact'] else 'FAIL'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-cli", default=os.environ.get("LANGGRAPH_CLI"),
                        help="a `langgraph` CLI with langgraph-cli[inmem] (default: $LANGGRAPH_CLI)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark works")
    parser.add_argument("--reps", type=int, help="repetitions of the latency phase (default 25)")
    parser.add_argument("--database", help="AgentKeel's database URL (default: a SQLite file, as `keel serve` "
                        "uses out of the box); memory:// matches the official in-memory server")
    parser.add_argument("--json", action="store_true", help="also print the raw results as JSON")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    if args.reps:
        sizes = Sizes(**{**sizes.__dict__, "reps": args.reps})

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="keel-gateway-bench-") as tmp:
        root = Path(tmp)
        print("measuring agentkeel (keel serve) ...", file=sys.stderr)
        with agentkeel_server(root, args.database) as server:
            results["agentkeel"] = asyncio.run(measure(server.url, sizes))
        if args.official_cli:
            print(f"measuring the official server ({args.official_cli} dev) ...", file=sys.stderr)
            with official_server(args.official_cli, root) as server:
                results["official"] = asyncio.run(measure(server.url, sizes))
    print(report(results, sizes))
    if args.json:
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
