"""What one large ``write_file`` call costs a streaming client, with and without argument batching.

A single tool call whose JSON arguments hold a file of SIZE bytes is streamed as CHUNKS
``messages`` events (``AIMessageChunk`` dumps with ``tool_call_chunks``, as the worker publishes
them), rendered by ``ModeRenderer`` for ``messages-tuple`` and for ``messages``, under three
policies: every chunk sent (``none``), DeerFlow's fixed 32 chunks (``fixed-32``) and AgentKeel's
default geometric batches (``adaptive``). Per case it reports the frames sent, the bytes the
client must JSON-parse (sum of the frames' encoded data), the client's parse time (``json.loads``
of every frame) and the server's render + encode time.

In ``messages`` mode every frame re-sends the message so far, so bytes grow with frames x size:
``none`` and ``fixed-32`` are quadratic, ``adaptive`` linear. ``bytes/arg`` (bytes parsed per
argument byte) makes that visible: constant across sizes only when linear. The ``none`` case in
``messages`` mode makes the client parse 33 GB at 4 MB, so by default only every 8th of its
frames is encoded and parsed and the sums are scaled up (marked ``~``; ``--sample 1`` measures
them all); every frame is still rendered. That case is most of the run time: about 6 minutes on
a 2-core machine at the default sizes, 40 s with ``--sizes 0.25,1``.

Run ``python benchmarks/tool_args.py [--sizes 1,4] [--chunks-per-mb 4000] [--sample K]``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from langchain_core.messages import AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk

from agentkeel.gateway.render import ModeRenderer
from agentkeel.gateway.toolargs import FIXED_BATCHES, BatchPolicy
from agentkeel.runtime.bridge.base import encode_data

MB = 1 << 20
POLICIES: dict[str, BatchPolicy | None] = {"none": None, "fixed-32": FIXED_BATCHES, "adaptive": BatchPolicy()}
MODES = ("messages-tuple", "messages")
METADATA = {
    "langgraph_step": 1,
    "langgraph_node": "model",
    "langgraph_triggers": ["branch:to:model"],
    "langgraph_path": ["__pregel_pull", "model"],
    "langgraph_checkpoint_ns": "model:5b1f6c3e-8a0e-4a63-9d55-6f1c0a9b2e11",
    "checkpoint_ns": "model:5b1f6c3e-8a0e-4a63-9d55-6f1c0a9b2e11",
    "ls_provider": "openai",
    "ls_model_name": "gpt-4.1",
    "ls_model_type": "chat",
    "ls_temperature": 0.0,
}


@dataclass(frozen=True, slots=True)
class Row:
    mode: str
    policy: str
    size: int
    frames: int
    parsed_bytes: int
    parse_s: float
    render_s: float
    sampled: bool

    @property
    def per_arg_byte(self) -> float:
        return self.parsed_bytes / self.size


def file_text(size: int) -> str:
    """Source-like text (quotes, newlines, so JSON escapes it) of exactly ``size`` characters."""
    lines: list[str] = []
    total, number = 0, 0
    while total < size:
        line = f'    value_{number} = compute("{number * 7919 % 100003}", flag=True)  # step {number}\n'
        lines.append(line)
        total += len(line)
        number += 1
    return "".join(lines)[:size]


def file_call_events(size: int, chunks: int) -> list[tuple[str, Any]]:
    """The ``messages`` events of one model reply that is a single ``write_file`` call."""
    args = json.dumps({"path": "/mnt/user-data/outputs/big.py", "content": file_text(size)})
    bounds = [round(i * len(args) / chunks) for i in range(chunks + 1)]
    events = []
    for i, (start, end) in enumerate(pairwise(bounds)):
        first = i == 0
        piece = tool_call_chunk(
            name="write_file" if first else None, args=args[start:end], id="call_1" if first else None, index=0
        )
        chunk = AIMessageChunk(content="", id="lc_run--bench", tool_call_chunks=[piece])
        events.append(("messages", [chunk.model_dump(), METADATA]))
    last = AIMessageChunk(
        content="", id="lc_run--bench", chunk_position="last", response_metadata={"finish_reason": "tool_calls"}
    )
    events.append(("messages", [last.model_dump(), METADATA]))
    return events


def measure(events: list[tuple[str, Any]], mode: str, policy: str, size: int, sample: int) -> Row:
    """Render ``events`` for ``mode``; encode and parse every frame (every ``sample``-th one, scaled)."""
    renderer = ModeRenderer([mode], POLICIES[policy])
    frames = parsed = 0
    parse_s = render_s = 0.0
    for index in range(len(events) + 1):
        started = time.perf_counter()
        out = renderer.feed(*events[index]) if index < len(events) else renderer.flush()
        render_s += time.perf_counter() - started
        for _name, data in out:
            frames += 1
            if frames % sample:
                continue
            started = time.perf_counter()
            encoded = encode_data(data)  # UTF-8 bytes, as the SSE frame carries them
            render_s += (time.perf_counter() - started) * sample
            started = time.perf_counter()
            json.loads(encoded)
            parse_s += (time.perf_counter() - started) * sample
            parsed += len(encoded) * sample
    return Row(mode, policy, size, frames, parsed, parse_s, render_s, sample > 1)


def run(sizes_mb: list[float], chunks_per_mb: int, sample: int) -> list[Row]:
    rows = []
    for size_mb in sizes_mb:
        size = int(size_mb * MB)
        events = file_call_events(size, max(1, round(size_mb * chunks_per_mb)))
        for mode in MODES:
            for policy in POLICIES:
                quadratic = mode == "messages" and policy == "none"
                rows.append(measure(events, mode, policy, size, sample if quadratic else 1))
    return rows


def report(rows: list[Row]) -> str:
    header = (
        f"{'mode':<15}{'policy':<10}{'arg MB':>7}{'frames':>8}{'parsed MB':>12}{'bytes/arg':>10}"
        f"{'parse s':>9}{'render s':>9}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        mark = "~" if row.sampled else " "
        lines.append(
            f"{row.mode:<15}{row.policy:<10}{row.size / MB:>7.1f}{row.frames:>8}"
            f"{mark}{row.parsed_bytes / MB:>11.1f}{row.per_arg_byte:>10.2f}{row.parse_s:>9.3f}{row.render_s:>9.3f}"
        )
    by_case = {(r.mode, r.policy): [x for x in rows if (x.mode, x.policy) == (r.mode, r.policy)] for r in rows}
    lines.append("")
    lines.append("growth of parsed bytes from the smallest to the largest size (x input growth):")
    for (mode, policy), case in by_case.items():
        if len(case) > 1:
            grow = case[-1].parsed_bytes / case[0].parsed_bytes
            lines.append(f"  {mode:<15}{policy:<10} x{grow:.1f} for x{case[-1].size / case[0].size:.1f} input")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,4", help="argument sizes in MB, comma-separated")
    parser.add_argument("--chunks-per-mb", type=int, default=4000, help="chunks per MB of file content")
    parser.add_argument("--sample", type=int, default=8, help="parse every K-th frame of messages/none, scaled")
    args = parser.parse_args(argv)
    rows = run([float(s) for s in args.sizes.split(",")], args.chunks_per_mb, args.sample)
    print(report(rows))
    return rows


if __name__ == "__main__":
    main()
