"""What the AgentKeel runtime costs on top of a bare LangGraph run of the same graph.

A run of ``--steps`` steps (a step is one model turn that calls the cheap ``ls`` tool: ``steps``
model calls + ``steps`` tool calls, then a final answer; scripted model, strict mode) is executed
two ways, interleaved, ``--repeat`` times each, and the best times are compared (median shown):

* **runtime**: ``open_runtime(KeelConfig(...))`` on the embedded default (SQLite file database in a
  temp dir, memory stream), ``manager.create(RunRequest(...))`` then ``manager.wait(run_id)``,
  timed from ``create`` to the stored final record (admission, journal, workspace snapshots,
  stream publishing, checkpoints and finalization all inside). The runtime stays open across
  rounds, as a server process would, after one short warm-up run.
* **bare**: the same graph built the same way (``Harness(config).build(...)``, timed too) on
  LangGraph's ``InMemorySaver``, driven by ``graph.astream(...)`` with the same stream mode,
  recursion limit and a ``RunContext`` on a temp workspace.

When the ratio is above the 1.2x target (or with ``--breakdown always``) a breakdown attributes the difference:
``memory://`` instead of SQLite, ``updates`` instead of ``values`` streaming, and the SQLite
checkpointer, the journal callbacks and stream publishing each added alone to the bare loop. Last,
the checkpoint bytes per step of a 400-message thread in ``full`` and ``delta`` mode, from
``benchmarks/checkpoint_bytes.py`` (a subprocess per mode: the checkpoint mode is frozen per
process, and ``open_runtime`` froze this one).

Run ``python benchmarks/run_overhead.py [--steps 200] [--repeat 3] [--breakdown auto|always|never]
[--checkpoint-mode full|delta] [--bytes-messages 400] [--profile]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.cli.event_loop import UVICORN_LOOP, run_async
from agentkeel.config import KeelConfig, Limits, ModelConfig
from agentkeel.database import Database
from agentkeel.harness.agents import Harness
from agentkeel.harness.context import RunContext
from agentkeel.harness.state import CheckpointMode
from agentkeel.runtime.bridge import open_bridge
from agentkeel.runtime.checkpoints import open_checkpointer
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.journal import Journal
from agentkeel.runtime.journal_callbacks import JournalCallbackHandler
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.serialization import EventEncoder
from agentkeel.runtime.stores.memory import MemoryJournalStore
from agentkeel.runtime.usage import UsageAccumulator

BENCH_DIR = Path(__file__).resolve().parent
TARGET_RATIO = 1.2  # issue 13: values mode, SQLite, a quiet machine
PROMPT = "List the workspace once per step, then say you are done."
MODEL_NAME = "bench"
WARMUP_MODEL = "warmup"
WARMUP_STEPS = 2
WORKLOAD_CAP = 1_000_000

# One step = one model turn that calls ``ls`` (then the tool node answers it). Explicit usage keeps
# token estimation out of the measurement; strict checking is on, as in every AgentKeel script.
SCRIPT_TEMPLATE = """\
strict: true
fallback: error
agents:
  lead:
    - say: "Step {{turn}}: listing the workspace."
      tool_calls: [{{name: ls, args: {{path: /workspace}}}}]
      usage: {{input: 100, output: 10}}
      repeat: {steps}
    - say: "Done after {steps} steps."
      usage: {{input: 100, output: 10}}
"""


# -- set-up -------------------------------------------------------------------------------------
def write_script(directory: Path, steps: int) -> Path:
    """The scripted model's script for a ``steps``-step run, written into ``directory``."""
    path = directory / f"bench-script-{steps}.yaml"
    path.write_text(SCRIPT_TEMPLATE.format(steps=steps))
    return path


def recursion_limit(steps: int) -> int:
    """A model and a tool superstep per step, the final answer, and some slack."""
    return 2 * steps + 10


def bench_config(
    directory: Path, steps: int, *, database: str = "sqlite", checkpoint_mode: CheckpointMode = "full"
) -> KeelConfig:
    """The embedded default (``database="sqlite"``: a SQLite file under ``directory``, memory
    stream), ``database="memory"`` (``memory://`` stores and checkpointer) or any database URL
    (``benchmarks/stores.py`` passes a PostgreSQL one), on the bench script.

    A second model, ``warmup``, plays a 2-step script: a runtime's first run pays one-off costs
    (SQLAlchemy statement compilation, first connections) that a long-lived runtime does not.
    """
    if database not in ("sqlite", "memory") and "://" not in database:
        raise ValueError(f"database must be 'sqlite', 'memory' or a URL, got {database!r}")
    limit = recursion_limit(max(steps, WARMUP_STEPS))
    return KeelConfig(
        data_dir=str(directory / "data"),
        database={"sqlite": None, "memory": "memory://"}.get(database, database),
        checkpoint_mode=checkpoint_mode,
        models=[
            ModelConfig(name=MODEL_NAME, use="scripted", script=str(write_script(directory, steps))),
            ModelConfig(name=WARMUP_MODEL, use="scripted", script=str(write_script(directory, WARMUP_STEPS))),
        ],
        limits=Limits(
            recursion_limit=limit, max_recursion_limit=max(1000, limit),
            # The workload repeats one cheap call on purpose: lift the guards that would (rightly)
            # stop it, so the run is as long as asked. They still run on every step.
            loop_detection={"warn_threshold": WORKLOAD_CAP, "hard_limit": WORKLOAD_CAP, "window_size": WORKLOAD_CAP,
                            "tool_freq_warn": WORKLOAD_CAP, "tool_freq_hard_limit": WORKLOAD_CAP},
            turn_limit={"max_turns": WORKLOAD_CAP},
            tool_progress={"stagnation_threshold": WORKLOAD_CAP},
        ),
        base_dir=directory,
    )


@dataclass(frozen=True)
class Sample:
    wall_ms: float
    cpu_ms: float  # process CPU time, all threads (aiosqlite runs in its own)
    gc_ms: float  # wall time spent in garbage collections (the cost of many live objects)


@dataclass(frozen=True)
class Stats:
    """Samples of one variant. ``wall_ms`` is the best (lowest) sample: on a shared machine other
    load only ever adds time, so the minimum is the steadiest estimate of what the code costs."""

    samples: tuple[Sample, ...]

    @property
    def wall_ms(self) -> float:
        return min(s.wall_ms for s in self.samples)

    @property
    def median_wall_ms(self) -> float:
        return statistics.median(s.wall_ms for s in self.samples)

    @property
    def cpu_ms(self) -> float:
        return min(s.cpu_ms for s in self.samples)

    @property
    def gc_ms(self) -> float:
        """GC time of the best sample."""
        return min(self.samples, key=lambda s: s.wall_ms).gc_ms

    @property
    def spread_ms(self) -> float:
        """Median minus best: how much noise this variant's samples carry."""
        return self.median_wall_ms - self.wall_ms


# Set by ``profile_runtime_run``: profiles exactly the timed region of the next runtime run.
_profiler: cProfile.Profile | None = None


@contextlib.asynccontextmanager
async def _clock(result: list[Sample], *, profile: bool = False) -> AsyncIterator[None]:
    gc.collect()  # every sample starts from a similar heap
    in_gc = [0.0, 0.0]  # total seconds, start of the current collection

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            in_gc[1] = time.perf_counter()
        else:
            in_gc[0] += time.perf_counter() - in_gc[1]

    profiler = _profiler if profile else None
    gc.callbacks.append(on_gc)
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    try:
        yield
    finally:
        if profiler is not None:
            profiler.disable()
        gc.callbacks.remove(on_gc)
    result.append(
        Sample((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000, in_gc[0] * 1000)
    )


# -- the two ways of running it -----------------------------------------------------------------
@contextlib.asynccontextmanager
async def open_bench_runtime(
    steps: int, *, database: str = "sqlite", checkpoint_mode: CheckpointMode = "full"
) -> AsyncIterator[Runtime]:
    """A runtime on a temp dir for ``steps``-step runs, warmed up by one ``warmup`` run.

    ``open_runtime`` freezes ``checkpoint_mode`` for the whole process: one mode per process.
    """
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmp:
        config = bench_config(Path(tmp), steps, database=database, checkpoint_mode=checkpoint_mode)
        async with open_runtime(config) as rt:
            await arun_runtime(rt, WARMUP_STEPS, model=WARMUP_MODEL)
            yield rt


async def arun_runtime(
    rt: Runtime, steps: int, *, stream_mode: str = "values", model: str = MODEL_NAME
) -> Sample:
    """One run on a new thread of ``rt``: timed from ``manager.create`` to the stored final record,
    so admission, journal, workspace snapshots, stream publishing, checkpointing and finalization
    are all inside. ``steps`` must match the ``model``'s script (checked from the journal)."""
    request = RunRequest(
        thread_id=f"bench-{uuid.uuid4().hex[:8]}", input=PROMPT, stream_mode=[stream_mode], model_name=model
    )
    timing: list[Sample] = []
    async with _clock(timing, profile=True):
        record = await rt.manager.create(request)
        final = await rt.manager.wait(record.run_id)
    assert final is not None and final.status == RunStatus.success, (final and final.error)
    events = await rt.journal.list(record.run_id, kinds=["model.call", "tool.call"])
    models = [e for e in events if e.kind == "model.call"]
    tools = [e for e in events if e.kind == "tool.call"]
    assert len(models) == steps + 1 and len(tools) == steps, (len(models), len(tools))
    bad = [e.data for e in tools if e.data.get("status") != "ok"]
    assert not bad, bad[:1]
    return timing[0]


async def arun_bare(
    steps: int,
    *,
    stream_mode: str = "values",
    checkpointer: str = "memory",
    checkpoint_mode: CheckpointMode = "full",
    journal: bool = False,
    publish: bool = False,
) -> Sample:
    """The same graph, built by the harness, driven by ``graph.astream`` directly.

    ``checkpointer="sqlite"`` swaps ``InMemorySaver`` for the runtime's SQLite saver; ``journal``
    adds the runtime's journal callbacks (into a memory journal store); ``publish`` sends every
    chunk through an ``EventEncoder`` and a memory stream bridge, as the worker does. Each isolates one
    runtime cost on the bare loop. Timed from ``harness.build`` to the end of the stream (the
    runtime's timing includes its graph build too).
    """
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmp:
        directory = Path(tmp)
        config = bench_config(directory, steps)
        harness = Harness(config, checkpoint_mode)
        resolved = harness.resolve("lead")
        run_id, thread_id = uuid.uuid4().hex, f"bench-{uuid.uuid4().hex[:8]}"
        run_config: RunnableConfig = {
            "configurable": {"thread_id": thread_id},
            "recursion_limit": recursion_limit(steps),
            "metadata": {"run_id": run_id, "assistant_id": "lead"},
        }
        context = RunContext(thread_id=thread_id, run_id=run_id, workspace_root=directory / "workspace")
        limits = config.limits
        bridge = open_bridge(
            "memory", retention=limits.stream_retention, ttl_s=limits.stream_ttl_s,
            heartbeat_s=limits.stream_heartbeat_s,
        )
        async with contextlib.AsyncExitStack() as stack:
            saver: BaseCheckpointSaver
            if checkpointer == "sqlite":
                connections = await stack.enter_async_context(
                    open_connections(Database.parse(f"sqlite:///{directory / 'bare.db'}"))
                )
                saver = await stack.enter_async_context(open_checkpointer(connections))
            elif checkpointer == "memory":
                saver = InMemorySaver()
            else:
                raise ValueError(f"checkpointer must be 'memory' or 'sqlite', got {checkpointer!r}")
            timing: list[Sample] = []
            encoder = EventEncoder()  # one per run, as the worker's
            async with _clock(timing):
                run_journal = None
                if journal:
                    run_journal = await Journal.open(MemoryJournalStore(), run_id, thread_id)
                    run_config["callbacks"] = [JournalCallbackHandler(run_journal, UsageAccumulator())]
                built = await harness.build(resolved, run_config)
                graph = built.graph.copy(update={"checkpointer": saver})
                async for mode, chunk in graph.astream(
                    {"messages": [{"role": "user", "content": PROMPT}]}, run_config,
                    context=dataclasses.replace(context, run_scope=built.scope), stream_mode=[stream_mode],  # type: ignore[call-overload, list-item]
                ):
                    if publish:
                        await bridge.publish_encoded(run_id, mode, encoder.encode(chunk))
                if publish:
                    await bridge.publish_end(run_id)
                if run_journal is not None:
                    await run_journal.close()
            messages = (await graph.aget_state(run_config)).values["messages"]
        await bridge.close()
    assert len(messages) == 2 * steps + 2, len(messages)
    errors = [m for m in messages if getattr(m, "status", "success") == "error"]
    assert not errors, errors[:1]
    return timing[0]


# -- measuring ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bench:
    """What variants run against: the step count and the open runtimes, keyed by database."""

    steps: int
    runtimes: dict[str, Runtime]
    checkpoint_mode: CheckpointMode = "full"


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    run: Callable[[Bench], Awaitable[Sample]]


HEADLINE = (
    Variant(
        "bare", "bare graph.astream, InMemorySaver [values]",
        lambda b: arun_bare(b.steps, checkpoint_mode=b.checkpoint_mode),
    ),
    Variant(
        "runtime", "AgentKeel runtime, SQLite + memory stream [values]",
        lambda b: arun_runtime(b.runtimes["sqlite"], b.steps),
    ),
)
BREAKDOWN = (
    Variant(
        "runtime_memdb", "runtime, memory:// database [values]",
        lambda b: arun_runtime(b.runtimes["memory"], b.steps),
    ),
    Variant(
        "runtime_updates", "runtime, SQLite [updates]",
        lambda b: arun_runtime(b.runtimes["sqlite"], b.steps, stream_mode="updates"),
    ),
    Variant(
        "runtime_memdb_updates", "runtime, memory:// database [updates]",
        lambda b: arun_runtime(b.runtimes["memory"], b.steps, stream_mode="updates"),
    ),
    Variant(
        "bare_updates", "bare [updates]",
        lambda b: arun_bare(b.steps, stream_mode="updates", checkpoint_mode=b.checkpoint_mode),
    ),
    Variant(
        "bare_sqlite", "bare + SQLite checkpointer",
        lambda b: arun_bare(b.steps, checkpointer="sqlite", checkpoint_mode=b.checkpoint_mode),
    ),
    Variant(
        "bare_sqlite_delta", "bare + SQLite checkpointer, delta mode",
        lambda b: arun_bare(b.steps, checkpointer="sqlite", checkpoint_mode="delta"),
    ),
    Variant(
        "bare_journal", "bare + journal callbacks",
        lambda b: arun_bare(b.steps, journal=True, checkpoint_mode=b.checkpoint_mode),
    ),
    Variant(
        "bare_publish", "bare + publish chunks to memory stream",
        lambda b: arun_bare(b.steps, publish=True, checkpoint_mode=b.checkpoint_mode),
    ),
)


async def ameasure(variants: tuple[Variant, ...], bench: Bench, repeat: int) -> dict[str, Stats]:
    """``repeat`` rounds, each running every variant once (interleaved, so drift hits all alike)."""
    samples: dict[str, list[Sample]] = {v.key: [] for v in variants}
    for _ in range(repeat):
        for variant in variants:
            samples[variant.key].append(await variant.run(bench))
    return {key: Stats(tuple(found)) for key, found in samples.items()}


async def arun_benchmark(
    steps: int, repeat: int, breakdown: str = "auto", checkpoint_mode: CheckpointMode = "full"
) -> dict[str, Stats]:
    """The headline pair; then, per ``breakdown`` (auto: above the target ratio), the breakdown.

    Runtimes stay open across rounds, like a long-lived server process; each is warmed up by one
    short run first, and the bare loop by one short run too.
    """
    async with contextlib.AsyncExitStack() as stack:
        sqlite = await stack.enter_async_context(open_bench_runtime(steps, checkpoint_mode=checkpoint_mode))
        bench = Bench(steps, {"sqlite": sqlite}, checkpoint_mode)
        await arun_bare(WARMUP_STEPS, checkpoint_mode=checkpoint_mode)
        results = await ameasure(HEADLINE, bench, repeat)
        ratio = results["runtime"].wall_ms / results["bare"].wall_ms
        if breakdown == "always" or (breakdown == "auto" and ratio > TARGET_RATIO):
            bench.runtimes["memory"] = await stack.enter_async_context(
                open_bench_runtime(steps, database="memory", checkpoint_mode=checkpoint_mode)
            )
            results.update(await ameasure(BREAKDOWN, bench, repeat))
    return results


def measure_checkpoint_bytes_isolated(mode: str, messages: int) -> dict[str, Any]:
    """``checkpoint_bytes.measure_checkpoint_bytes`` in a fresh interpreter.

    The checkpoint mode is frozen per process (``open_runtime`` froze ``full`` here), so each mode
    is measured in a process of its own rather than relying on that function never freezing it.
    """
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(BENCH_DIR)!r})\n"
        "from checkpoint_bytes import measure_checkpoint_bytes\n"
        f"row = measure_checkpoint_bytes({mode!r}, {messages})\n"
        "row.pop('per_step')\n"
        "print(json.dumps(row))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"checkpoint_bytes ({mode}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_runtime_run(steps: int, top: int = 25, checkpoint_mode: CheckpointMode = "full") -> str:
    """cProfile of one runtime run's timed region (SQLite, values), top functions by own time."""
    profiler = cProfile.Profile()

    async def run() -> None:
        global _profiler
        async with open_bench_runtime(steps, checkpoint_mode=checkpoint_mode) as rt:
            _profiler = profiler
            try:
                await arun_runtime(rt, steps)
            finally:
                _profiler = None

    asyncio.run(run())
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- reporting ----------------------------------------------------------------------------------
_LABEL = 54


def _header() -> str:
    columns = (
        f"{'variant':<{_LABEL}} {'best ms':>9} {'median ms':>10} {'ms/step':>8} {'CPU ms':>9} "
        f"{'GC ms':>7} {'vs bare':>8}"
    )
    return f"{columns}\n{'-' * len(columns)}"


def _row(label: str, stats: Stats, steps: int, base: Stats) -> str:
    return (
        f"{label:<{_LABEL}} {stats.wall_ms:>9,.0f} {stats.median_wall_ms:>10,.0f} {stats.wall_ms / steps:>8.1f} "
        f"{stats.cpu_ms:>9,.0f} {stats.gc_ms:>7,.0f} {stats.wall_ms / base.wall_ms:>7.2f}x"
    )


def attribution(
    results: dict[str, Stats], mode: CheckpointMode = "full"
) -> list[tuple[str, float, float, float]]:
    """(what, wall ms, noise ms, CPU ms): differences of best times that say where the runtime's
    extra time goes. On a busy machine the CPU difference is the steadier one. The parts overlap rather than add up: a cost that keeps many objects alive (the stream's
    retained ``values`` events) also makes every garbage collection of the other parts slower."""
    pairs = [
        ("runtime overhead (runtime - bare)", "runtime", "bare"),
        ("  SQLite database (runtime - runtime memory://)", "runtime", "runtime_memdb"),
        ("  values streaming (runtime [values] - [updates])", "runtime", "runtime_updates"),
        ("  rest, memory:// [updates] (minus bare [updates])", "runtime_memdb_updates", "bare_updates"),
        (f"bare + SQLite checkpointer, {mode} mode (minus bare)", "bare_sqlite", "bare"),
        ("bare + SQLite checkpointer, delta mode (minus bare)", "bare_sqlite_delta", "bare"),
        ("bare + journal callbacks (minus bare)", "bare_journal", "bare"),
        ("bare + encoding and stream publish (minus bare)", "bare_publish", "bare"),
    ]
    return [
        (
            label,
            results[a].wall_ms - results[b].wall_ms,
            results[a].spread_ms + results[b].spread_ms,
            results[a].cpu_ms - results[b].cpu_ms,
        )
        for label, a, b in pairs
    ]


def report(
    steps: int,
    repeat: int,
    results: dict[str, Stats],
    bytes_rows: list[dict[str, Any]],
    mode: CheckpointMode = "full",
) -> str:
    base, runtime = results["bare"], results["runtime"]
    ratio = runtime.wall_ms / base.wall_ms
    median_ratio = runtime.median_wall_ms / base.median_wall_ms
    lines = [
        f"AgentKeel run overhead: {steps} steps = {steps} model calls + {steps} `ls` calls + a final answer",
        (
            f"(scripted model, strict mode, checkpoint mode {mode}); {repeat} rounds, variants "
            "interleaved; best = lowest wall time, CPU = lowest process CPU time (all threads)"
        ),
        "",
        _header(),
        *(_row(v.label, results[v.key], steps, base) for v in HEADLINE),
        (
            f"ratio runtime/bare: {ratio:.2f}x best wall ({median_ratio:.2f}x median, "
            f"{runtime.cpu_ms / base.cpu_ms:.2f}x CPU); target <= {TARGET_RATIO:.1f}x: "
            f"{'met' if ratio <= TARGET_RATIO else 'MISSED'}"
        ),
    ]
    if "runtime_memdb" in results:
        lines += ["", "breakdown:", _header()]
        lines += [_row(v.label, results[v.key], steps, base) for v in BREAKDOWN]
        lines += [
            "",
            f"{'where the extra time goes (differences of best times)':<{_LABEL}} "
            + f"{'wall ms':>9} {'ms/step':>10} {'noise ms':>9} {'CPU ms':>9}",
        ]
        lines += [
            f"{label:<{_LABEL}} {ms:>9,.0f} {ms / steps:>10.1f} {noise:>9,.0f} {cpu:>9,.0f}"
            for label, ms, noise, cpu in attribution(results, mode)
        ]
        lines.append("(noise = median minus best wall time of both variants; smaller differences are not signal)")
    if bytes_rows:
        lines += [
            "",
            (
                f"checkpoint bytes of a {bytes_rows[0]['messages']}-message thread "
                "(benchmarks/checkpoint_bytes.py, a subprocess per mode):"
            ),
            f"{'mode':<6} {'steps':>6} {'total bytes':>13} {'bytes/step (last 50)':>21} {'head read ms':>13}",
        ]
        for row in bytes_rows:
            lines.append(
                f"{row['mode']:<6} {row['steps']:>6} {row['total_bytes']:>13,} "
                f"{row['bytes_per_step_last_50']:>21,.0f} {row['head_read_ms']:>13.1f}"
            )
        by_mode = {row["mode"]: row for row in bytes_rows}
        if {"full", "delta"} <= by_mode.keys():
            full, delta = by_mode["full"], by_mode["delta"]
            lines.append(
                f"full/delta: total {full['total_bytes'] / delta['total_bytes']:.1f}x, "
                f"per step (last 50) {full['bytes_per_step_last_50'] / delta['bytes_per_step_last_50']:.1f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="tool-calling model turns per run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of them is compared")
    parser.add_argument(
        "--breakdown", choices=("auto", "always", "never"), default="auto",
        help=f"explain the overhead (auto: only when the ratio exceeds {TARGET_RATIO}x)",
    )
    parser.add_argument(
        "--checkpoint-mode", choices=("full", "delta"), default="full",
        help="checkpoint channel mode of the runtime and the bare graph",
    )
    parser.add_argument(
        "--bytes-messages", type=int, default=400, help="thread size for the checkpoint bytes (0: skip)"
    )
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of one runtime run")
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default=UVICORN_LOOP,
        help="the event loop both variants run on (default: what the keel processes run on)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeat < 1:
        parser.error("--steps and --repeat must be at least 1")

    print(f"event loop: {args.loop}", flush=True)
    results = run_async(arun_benchmark(args.steps, args.repeat, args.breakdown, args.checkpoint_mode), args.loop)
    bytes_rows = (
        [measure_checkpoint_bytes_isolated(mode, args.bytes_messages) for mode in ("full", "delta")]
        if args.bytes_messages > 0
        else []
    )
    print(report(args.steps, args.repeat, results, bytes_rows, args.checkpoint_mode), flush=True)
    if args.profile:
        print(f"\ncProfile of one runtime run (SQLite, values, {args.checkpoint_mode} mode), by own time:")
        print(profile_runtime_run(args.steps, checkpoint_mode=args.checkpoint_mode), flush=True)
    return {
        "steps": args.steps,
        "ratio": results["runtime"].wall_ms / results["bare"].wall_ms,
        "results": results,
        "checkpoint_bytes": bytes_rows,
    }


if __name__ == "__main__":
    main()
