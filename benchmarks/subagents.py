"""DeerFlow #3875 replayed with the runaway guards on, and with them effectively off.

The incident: a lead delegated three one-sentence writing tasks; each subagent called the same
``write_file`` over and over until something outside stopped it (about 4.4M tokens, 99.7 % of
them spent by the subagents). Here the lead delegates ``--children`` such tasks in one response on
the [scripted model](../docs/scripted-model.md); each child replays one ``write_file`` with
``repeat: forever``, so only a guard can end it. Token counts are the scripted model's ``auto``
estimate of each real request (four characters per token), so input grows with the child's
context exactly as it would on a provider.

Two variants, each a full run through the runtime (``open_runtime`` on memory://,
``manager.create`` to ``manager.wait``), in one process:

* **guards on**: the default chain and limits (the loop guard stops a child on its
  ``hard_limit``-th identical call set, then one forced final answer);
* **guards off**: the same mandatory chain — it cannot be removed — with the runaway guards'
  thresholds out of reach: loop detection limits and the token budget huge, and a turn limit of
  ``--max-turns`` (150, DeerFlow's recursion limit) for lead and children. That is a chain
  without runaway guards, stopped only by a turn limit.

Printed side by side: input / output / total tokens, model calls (lead + children), wall time and
how each child ended.

Run ``python benchmarks/subagents.py [--children 3] [--max-turns 150] [--delay-ms 0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentkeel.config import KeelConfig
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import open_runtime

UNREACHABLE = 10**9
SUBAGENT = "general-purpose"
PROMPT = "Write one sentence per topic, one subagent each."
TOPICS = ("rivers", "hills", "seas", "forests", "deserts", "glaciers", "islands", "valleys")


@dataclass
class Measured:
    variant: str
    status: str
    input_tokens: int
    output_tokens: int
    total_tokens: int
    lead_calls: int
    child_calls: int
    wall_s: float
    child_endings: dict[str, int]  # "completed/loop_capped" -> how many children ended so


def script(children: int, delay_ms: int) -> dict[str, Any]:
    """The lead delegates ``children`` sentences at once, then answers; every child repeats one write."""
    if not 1 <= children <= len(TOPICS):
        raise SystemExit(f"--children must be between 1 and {len(TOPICS)}")
    tasks = [{"name": "task", "args": {"description": f"Sentence about {t}", "subagent_type": SUBAGENT,
                                        "prompt": f"Write one sentence about {t} to /workspace/outputs/{t}.md"}}
             for t in TOPICS[:children]]
    write = {"name": "write_file", "args": {"path": "/workspace/outputs/sentence-{instance}.md",
                                            "content": "A sentence.\n"}}
    child: dict[str, Any] = {"tool_calls": [write], "repeat": "forever"}
    if delay_ms:
        child["delay_ms"] = delay_ms
    return {"agents": {
        "lead": [{"say": "Delegating one sentence each.", "tool_calls": tasks},
                 {"say": "The sentences are written."}],
        SUBAGENT: [child],
    }}


def config(root: Path, children: int, guards: bool, max_turns: int, delay_ms: int) -> KeelConfig:
    path = root / "replay.yaml"
    path.write_text(yaml.safe_dump(script(children, delay_ms), sort_keys=False))
    raw: dict[str, Any] = {
        "data_dir": str(root / ("data-on" if guards else "data-off")),
        "database": "memory://",
        "models": [{"name": "replay", "use": "scripted", "script": str(path)}],
        "subagents": {"max_concurrent": children, "max_per_run": max(children, 6)},
    }
    if not guards:
        # The mandatory guards stay in the chain; only their thresholds are put out of reach.
        raw["limits"] = {
            "loop_detection": {"warn_threshold": UNREACHABLE, "hard_limit": UNREACHABLE, "window_size": UNREACHABLE,
                               "tool_freq_warn": UNREACHABLE, "tool_freq_hard_limit": UNREACHABLE},
            "token_budget": {"max_tokens": UNREACHABLE},
            "turn_limit": {"max_turns": max_turns},
            "recursion_limit": max_turns * 4 + 10,
        }
        raw["subagents"]["types"] = [{"name": SUBAGENT, "max_turns": max_turns}]
    return KeelConfig(**raw, base_dir=root)


async def measure(variant: str, cfg: KeelConfig) -> Measured:
    async with open_runtime(cfg) as rt:
        began = time.perf_counter()
        run = await rt.manager.create(RunRequest(thread_id="replay-" + variant.replace(" ", "-"), input=PROMPT))
        record = await rt.manager.wait(run.run_id)
        wall = time.perf_counter() - began
        assert record is not None
        events = await rt.journal.list(run.run_id)
    calls = Counter(e.caller for e in events if e.kind == "model.call")
    endings = Counter(f"{e.data['status']}/{e.data['stop_reason'] or '-'}" for e in events if e.kind == "subagent.end")
    usage = record.usage
    return Measured(
        variant, record.status.value, usage["input_tokens"], usage["output_tokens"], usage["total_tokens"],
        calls["lead"], calls[f"subagent:{SUBAGENT}"], wall, dict(endings),
    )


def report(rows: list[Measured], children: int, max_turns: int) -> None:
    print(f"DeerFlow #3875 replay: {children} children, each repeating one write_file forever")
    print(f"(scripted model, auto usage; guards off = loop/token thresholds out of reach, max_turns {max_turns})\n")
    header = f"{'':<26}" + "".join(f"{r.variant:>18}" for r in rows)
    print(header)
    lines: list[tuple[str, list[str]]] = [
        ("run status", [r.status for r in rows]),
        ("input tokens", [f"{r.input_tokens:,}" for r in rows]),
        ("output tokens", [f"{r.output_tokens:,}" for r in rows]),
        ("total tokens", [f"{r.total_tokens:,}" for r in rows]),
        ("model calls (lead)", [str(r.lead_calls) for r in rows]),
        ("model calls (children)", [str(r.child_calls) for r in rows]),
        ("wall time s", [f"{r.wall_s:.2f}" for r in rows]),
    ]
    for label, values in lines:
        print(f"{label:<26}" + "".join(f"{v:>18}" for v in values))
    for r in rows:
        print(f"children ({r.variant}): " + ", ".join(f"{n} x {how}" for how, n in sorted(r.child_endings.items())))
    on, off = rows
    if on.total_tokens:
        print(f"\nwithout the guards: {off.total_tokens / on.total_tokens:.1f}x the tokens, "
              f"{off.child_calls / max(on.child_calls, 1):.1f}x the child model calls")


def main(argv: list[str] | None = None) -> list[Measured]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=150, help="the guards-off turn limit (DeerFlow: 150)")
    parser.add_argument("--delay-ms", type=int, default=0, help="simulated latency of each child turn")
    args = parser.parse_args(argv)

    async def both() -> list[Measured]:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            return [
                await measure("guards on", config(root, args.children, True, args.max_turns, args.delay_ms)),
                await measure("guards off", config(root, args.children, False, args.max_turns, args.delay_ms)),
            ]

    rows = asyncio.run(both())
    for row in rows:
        if row.status != RunStatus.success.value:
            print(f"note: the {row.variant!r} run ended {row.status}")
    report(rows, args.children, args.max_turns)
    return rows


if __name__ == "__main__":
    main()
