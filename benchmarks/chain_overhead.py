"""What the guard chain costs per model turn: the same agent with and without it, side by side.

A *step* is one model turn that calls the cheap ``ls`` tool (scripted model, strict mode, an
in-memory checkpointer, no runtime around it), so the difference between the two variants is the
sixteen middlewares of the default lead chain: their request rewrites, response checks, hashing
and tool wrappers. The guards' thresholds are lifted so the deliberately repetitive run is as long
as asked; every guard still runs on every step. Variants are interleaved round by round so machine
noise hits both alike; the table reports the best and median wall time.

    .venv/bin/python benchmarks/chain_overhead.py              # 200 steps, 3 rounds
    .venv/bin/python benchmarks/chain_overhead.py --steps 50 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.config import SubagentsConfig
from agentkeel.harness.context import RunContext
from agentkeel.harness.middleware.catalog import build_agent_chain
from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptSession
from agentkeel.harness.tools import build_tools
from agentkeel.limits import Limits

TARGET_MS_PER_STEP = 2.0  # the chain should cost less than this per model turn on these machines
CAP = 1_000_000
LIFTED = Limits(
    loop_detection={"warn_threshold": CAP, "hard_limit": CAP, "window_size": CAP,
                    "tool_freq_warn": CAP, "tool_freq_hard_limit": CAP},
    turn_limit={"max_turns": CAP},
    tool_progress={"stagnation_threshold": CAP},
)


def _script(steps: int) -> Script:
    return Script.model_validate({"strict": True, "fallback": "error", "agents": {"lead": [
        {"say": "Step {turn}.", "tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}],
         "usage": {"input": 100, "output": 10}, "repeat": steps},
        {"say": f"Done after {steps} steps.", "usage": {"input": 100, "output": 10}},
    ]}})


VARIANTS = {  # name -> the chain's grammar mode (None: no chain)
    "without chain": None,
    "chain, repair mode": False,  # real providers: requests are checked once, innermost
    "chain, strict mode": True,  # strict scripted model: every rewriting guard checks what it sends
}


async def _one_run(steps: int, strict: bool | None, workspace: Path) -> float:
    model = ScriptedChatModel(script=_script(steps), session=ScriptSession(uuid.uuid4().hex[:8])).for_agent("lead")
    # The default lead has the task tool, so its chain carries SubagentLimit too.
    middleware = [] if strict is None else build_agent_chain(
        "lead", LIFTED, strict_grammar=strict, delegation=SubagentsConfig()
    ).for_agent()
    graph = create_agent(model, build_tools(bash_enabled=False), middleware=middleware,
                         system_prompt="Benchmark agent.", context_schema=RunContext,
                         checkpointer=InMemorySaver(), name="lead")
    thread = uuid.uuid4().hex
    config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 2 * steps + 20}
    context = RunContext(thread_id=thread, run_id=uuid.uuid4().hex, workspace_root=workspace)
    began = time.perf_counter()
    async for _ in graph.astream({"messages": [("user", "List the workspace each step.")]}, config,
                                 context=context, stream_mode="values"):
        pass
    elapsed = (time.perf_counter() - began) * 1000
    messages = (await graph.aget_state(config)).values["messages"]
    assert len(messages) == 2 * steps + 2, len(messages)
    return elapsed


async def measure(steps: int, repeat: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        await _one_run(2, True, workspace)  # warm-up: imports, first compilations
        for _ in range(repeat):
            for name, strict in VARIANTS.items():
                samples[name].append(await _one_run(steps, strict, workspace))
    return samples


def report(steps: int, samples: dict[str, list[float]]) -> dict[str, float]:
    print(f"Guard chain overhead: {steps} steps = {steps} model calls + {steps} `ls` calls + a final answer")
    print("(scripted model, strict mode, InMemorySaver, no runtime; best = lowest wall time)\n")
    print(f"{'variant':<22}{'best ms':>10}{'median ms':>11}{'ms/step':>9}{'chain ms/step':>15}")
    best = {name: min(values) for name, values in samples.items()}
    cost = {name: (best[name] - best["without chain"]) / steps for name in samples}
    for name, values in samples.items():
        print(f"{name:<22}{best[name]:>10,.0f}{statistics.median(values):>11,.0f}{best[name] / steps:>9.2f}"
              f"{cost[name]:>15.2f}")
    per_step = cost["chain, repair mode"]
    verdict = "met" if per_step <= TARGET_MS_PER_STEP else "NOT met"
    print(f"\nchain cost in repair mode (production): {per_step:.2f} ms per model turn (best vs best); "
          f"target <= {TARGET_MS_PER_STEP} ms: {verdict}")
    return {"per_step_ms": per_step, **{f"cost_{k}": v for k, v in cost.items()}}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    return report(args.steps, asyncio.run(measure(args.steps, args.repeat)))


if __name__ == "__main__":
    main()
