"""Per-run cost of the database under one process: SQLite vs PostgreSQL vs ``memory://``, side by side.

Every configuration is one ``open_runtime`` in this process (worker included, memory stream), on
the scripted workload of ``benchmarks/run_overhead.py`` (a step is one model turn calling ``ls``):

* **sqlite**: the embedded default (a SQLite file in a temp dir);
* **postgres**: a scratch database created on ``--pg-admin``'s server and dropped afterwards;
* **memory**: ``memory://`` stores and checkpointer (the floor: no database at all).

Per configuration, interleaved over ``--rounds`` (best round kept: other load on a shared machine
only ever adds time):

a. **sequential**: ``--sequential`` runs of ``--steps`` steps one after the other; per-run time
   from ``manager.create`` to the stored final record.
b. **concurrent**: ``--concurrent`` such runs started together; per-run time is the mean of the
   runs' own create-to-record times.
c. **first graph event** of (a) and (b): from ``manager.create`` to the first event a subscriber
   of the run's stream receives after the worker's ``metadata`` event (the graph's first chunk), so
   admission, the claim, the journal opening and the graph build are inside. Reported as the
   median over the runs; under concurrency, ``/ seq`` divides it by the sequential median.
d. **short burst**: ``--short`` runs of ``--short-steps`` steps started together; the wall time
   until the last one is stored.

**CPU ms/run** is this process's CPU time (all its threads) over a scenario divided by its runs;
PostgreSQL's own CPU is in another process and not counted. On a shared machine the CPU figures
move less than the wall times.

``--calls N`` measures instead what one store call costs: ``N`` calls each of four one-statement
calls (``set_thread_status``, ``get``, a one-event ``journal.append``, ``journal.list``) on an idle
database of each SQL configuration, wall and CPU time per call; and what one step costs the
checkpointer: ``N`` times an ``aput`` of a 20-message checkpoint (a new ``messages`` version each
time, as a model turn makes) followed by an ``aput_writes`` of one task's two writes.

Run ``python benchmarks/stores.py [--steps 30] [--sequential 5] [--concurrent 10] [--short 50]
[--short-steps 1] [--rounds 2] [--databases sqlite,postgres,memory] [--pg-admin URL] [--calls N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkeel.cli.event_loop import UVICORN_LOOP, run_async
from agentkeel.config import ModelConfig
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.stores.base import JournalEvent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_overhead import PROMPT, WARMUP_MODEL, WARMUP_STEPS, bench_config, write_script  # type: ignore[import-not-found]  # noqa: E402
from workers import PG_ADMIN, scratch_database  # type: ignore[import-not-found]  # noqa: E402

DATABASES = ("sqlite", "postgres", "memory")


@dataclass(frozen=True)
class Timed:
    run_ms: float  # create -> stored final record
    first_graph_ms: float  # create -> first graph chunk received by a subscriber
    run_id: str


@dataclass
class Result:
    """The best round of one configuration, per scenario."""

    sequential: list[Timed] = field(default_factory=list)
    concurrent: list[Timed] = field(default_factory=list)
    short_wall_ms: float = float("inf")
    cpu_ms: dict[str, float] = field(default_factory=dict)  # this process's CPU per run, per scenario


async def timed_run(rt: Runtime, model: str, steps: int) -> Timed:
    """One run on a new thread, followed on the stream from before its first event."""
    request = RunRequest(thread_id=f"bench-{uuid.uuid4().hex[:10]}", input=PROMPT, stream_mode=["values"],
                         model_name=model)
    started = time.perf_counter()
    record = await rt.manager.create(request)
    first: float | None = None
    async with contextlib.aclosing(rt.bridge.subscribe(record.run_id, last_event_id="-1")) as events:
        async for item in events:
            if item.kind == "end":
                break
            if item.kind == "data" and item.event != "metadata" and first is None:
                first = time.perf_counter()
    final = await rt.manager.wait(record.run_id)
    ended = time.perf_counter()
    assert final is not None and final.status == RunStatus.success, final and final.error
    assert first is not None, "no graph event was published"
    return Timed((ended - started) * 1000, (first - started) * 1000, record.run_id)


async def verify(rt: Runtime, samples: list[Timed], steps: int) -> None:
    """Each run made its ``steps`` tool calls; checked after the scenario, outside its timing
    (reading the journal back is not part of running)."""
    for sample in samples:
        calls = await rt.journal.list(sample.run_id, kinds=["tool.call"])
        assert len(calls) == steps, (len(calls), steps)


@contextlib.asynccontextmanager
async def open_configuration(name: str, steps: int, short_steps: int, pg_admin: str) -> AsyncIterator[Runtime]:
    """A warmed-up runtime on database ``name``; a ``short`` model plays the short-burst script."""
    with tempfile.TemporaryDirectory(prefix=f"keel-stores-{name}-") as tmp:
        directory = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            database = name
            if name == "postgres":
                scratch = f"keel_stores_{uuid.uuid4().hex[:10]}"
                database = await scratch_database(pg_admin, scratch, create=True)
                stack.push_async_callback(scratch_database, pg_admin, scratch, False)
            config = bench_config(directory, steps, database=database)
            short = ModelConfig(name="short", use="scripted", script=str(write_script(directory, short_steps)))
            config = config.model_copy(update={"models": [*config.models, short]})
            rt = await stack.enter_async_context(open_runtime(config))
            for _ in range(2):  # first connections, statement compilation, graph build caches
                await timed_run(rt, WARMUP_MODEL, WARMUP_STEPS)
            yield rt


async def measure_round(rt: Runtime, result: Result, args: argparse.Namespace) -> None:
    cpu = time.process_time()
    sequential = [await timed_run(rt, "bench", args.steps) for _ in range(args.sequential)]
    cpu_sequential = (time.process_time() - cpu) * 1000 / args.sequential
    await verify(rt, sequential, args.steps)
    cpu = time.process_time()
    concurrent = list(await asyncio.gather(*(timed_run(rt, "bench", args.steps) for _ in range(args.concurrent))))
    cpu_concurrent = (time.process_time() - cpu) * 1000 / args.concurrent
    await verify(rt, concurrent, args.steps)
    cpu, started = time.process_time(), time.perf_counter()
    short = list(await asyncio.gather(*(timed_run(rt, "short", args.short_steps) for _ in range(args.short))))
    short_ms = (time.perf_counter() - started) * 1000
    cpu_short = (time.process_time() - cpu) * 1000 / args.short
    await verify(rt, short, args.short_steps)
    for scenario, spent in (("sequential", cpu_sequential), ("concurrent", cpu_concurrent), ("short", cpu_short)):
        result.cpu_ms[scenario] = min(result.cpu_ms.get(scenario, spent), spent)
    if not result.sequential or _mean_run(sequential) < _mean_run(result.sequential):
        result.sequential = sequential
    if not result.concurrent or _mean_run(concurrent) < _mean_run(result.concurrent):
        result.concurrent = concurrent
    result.short_wall_ms = min(result.short_wall_ms, short_ms)


def _mean_run(samples: list[Timed]) -> float:
    return statistics.fmean(s.run_ms for s in samples)


def _first(samples: list[Timed]) -> float:
    return statistics.median(s.first_graph_ms for s in samples)


async def arun(args: argparse.Namespace) -> dict[str, Result]:
    names = [n for n in args.databases.split(",") if n]
    results = {name: Result() for name in names}
    async with contextlib.AsyncExitStack() as stack:
        runtimes = {
            name: await stack.enter_async_context(open_configuration(name, args.steps, args.short_steps, args.pg_admin))
            for name in names
        }
        for round_ in range(args.rounds):
            for name in names:
                print(f"round {round_ + 1}: {name} ...", file=sys.stderr, flush=True)
                await measure_round(runtimes[name], results[name], args)
    return results


async def measure_calls(names: list[str], calls: int, pg_admin: str) -> str:
    """Per-call wall and CPU ms of four one-statement store calls, per SQL configuration."""
    out = ["| database | call | wall ms/call | CPU ms/call |", "|---|---|---:|---:|"]
    for name in (n for n in names if n != "memory"):
        async with open_configuration(name, 1, 1, pg_admin) as rt:
            await rt.store.upsert_thread("calls")
            probes: dict[str, Callable[[int], Awaitable[object]]] = {
                "set_thread_status": lambda i: rt.store.set_thread_status("calls", "busy"),
                "get": lambda i: rt.store.get("no-such-run"),
                "journal.append (1 event)": lambda i: rt.journal.append(
                    [JournalEvent("calls-run", "calls", i + 1, "model.call", {"n": i})]),
                "journal.list": lambda i: rt.journal.list("calls-run", limit=1),
            }
            probes["checkpoint step (aput + aput_writes)"] = checkpoint_step(rt)
            for label, call in probes.items():
                wall, cpu = time.perf_counter(), time.process_time()
                for i in range(calls):
                    await call(i)
                out.append(f"| {name} | {label} | {(time.perf_counter() - wall) * 1000 / calls:.3f} | "
                           f"{(time.process_time() - cpu) * 1000 / calls:.3f} |")
    return "\n".join(out)


def checkpoint_step(rt: Runtime) -> Callable[[int], Awaitable[object]]:
    """One step's checkpoint traffic on a thread of its own: ``aput``, then one task's writes."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    messages = [AIMessage(content=f"turn {i} " + "x" * 200, id=f"m{i}") for i in range(20)]
    state: dict[str, Any] = {
        "config": {"configurable": {"thread_id": f"calls-{uuid.uuid4().hex[:8]}", "checkpoint_ns": ""}},
        "checkpoint": empty_checkpoint(),
    }

    async def step(i: int) -> None:
        checkpoint = create_checkpoint(state["checkpoint"], None, i)
        versions = {"messages": str(i + 1), "step": str(i + 1)}
        checkpoint["channel_values"] = {"messages": messages, "step": i}
        checkpoint["channel_versions"] = versions
        state["checkpoint"] = checkpoint
        state["config"] = await rt.checkpointer.aput(state["config"], checkpoint, {"step": i, "source": "loop"}, versions)
        await rt.checkpointer.aput_writes(
            state["config"], [("messages", ToolMessage(content="ok", tool_call_id="t")), ("step", i)], f"task-{i}",
        )

    return step


def report(results: dict[str, Result], args: argparse.Namespace) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = [
        f"{args.steps}-step runs: {args.sequential} sequential, {args.concurrent} concurrent; "
        f"{args.short} concurrent {args.short_steps}-step runs; best of {args.rounds} rounds; "
        f"load average at the end {load}",
        "",
        "| database | sequential ms/run | CPU ms/run | first graph event ms | concurrent ms/run | CPU ms/run "
        "| first graph event ms | / seq | short burst wall ms | CPU ms/run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        seq_first, conc_first = _first(r.sequential), _first(r.concurrent)
        cpu = r.cpu_ms
        out.append(
            f"| {name} | {_mean_run(r.sequential):,.0f} | {cpu['sequential']:,.0f} | {seq_first:,.0f} | "
            f"{_mean_run(r.concurrent):,.0f} | {cpu['concurrent']:,.0f} | {conc_first:,.0f} | "
            f"{conc_first / seq_first:.2f}x | {r.short_wall_ms:,.0f} | {cpu['short']:,.0f} |"
        )
    if {"sqlite", "postgres"} <= results.keys():
        sq, pg = results["sqlite"], results["postgres"]
        out.append(
            f"\npostgres / sqlite per run: sequential {_mean_run(pg.sequential) / _mean_run(sq.sequential):.2f}x, "
            f"concurrent {_mean_run(pg.concurrent) / _mean_run(sq.concurrent):.2f}x"
        )
    if {"sqlite", "memory"} <= results.keys():
        ratio = results["sqlite"].short_wall_ms / results["memory"].short_wall_ms
        out.append(f"short burst, embedded (sqlite) / memory://: {ratio:.2f}x (target <= 1.5x)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="tool-calling model turns per run")
    parser.add_argument("--sequential", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--short", type=int, default=50, help="runs of the short burst")
    parser.add_argument("--short-steps", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best one is kept")
    parser.add_argument("--databases", default=",".join(DATABASES))
    parser.add_argument("--pg-admin", default=PG_ADMIN, help="a database URL on the server to create scratch databases on")
    parser.add_argument("--calls", type=int, default=0, help="measure N of each store call instead of runs")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default=UVICORN_LOOP,
                        help="the event loop (default: what the keel processes run on)")
    args = parser.parse_args(argv)
    print(f"event loop: {args.loop}", flush=True)
    if args.calls > 0:
        print(run_async(measure_calls(args.databases.split(","), args.calls, args.pg_admin), args.loop), flush=True)
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return {}
    if min(args.steps, args.sequential, args.concurrent, args.short, args.rounds) < 1:
        parser.error("counts must be at least 1")
    results = run_async(arun(args), args.loop)
    print(report(results, args), flush=True)
    return results


if __name__ == "__main__":
    main()
