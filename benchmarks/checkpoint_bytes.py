"""How many bytes a thread's checkpoints cost per step, full vs delta message channel mode.

A step is one chat turn through the real Pregel loop: the input superstep writes the user message,
the ``reply`` node's superstep writes the assistant message. Bytes are what SQLite stores for the
thread after each step (checkpoint blobs, which embed channel values, plus metadata, plus the
``writes`` rows), so the numbers include every per-step overhead a deployment pays, not just the
message payload. Run ``python benchmarks/checkpoint_bytes.py [--messages N] [--chars C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph

from agentkeel.database import Database
from agentkeel.harness.state import CheckpointMode, messages_state_schema
from agentkeel.runtime.checkpoints import (
    StateAccessor,
    checkpoint_config,
    mark_checkpoint_mode,
    open_checkpointer,
)
from agentkeel.runtime.connections import open_connections

THREAD = "bench"
_STORED_BYTES_SQL = """
SELECT
  (SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0)
     FROM checkpoints WHERE thread_id = ?)
  + (SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE thread_id = ?)
"""


def _text(kind: str, step: int, chars: int) -> str:
    base = f"{kind} {step}: "
    return (base + "lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]


async def ameasure_checkpoint_bytes(
    mode: CheckpointMode, messages: int = 400, *, message_chars: int = 400
) -> dict[str, Any]:
    """Build a thread of ``messages`` messages (two per step) and measure bytes stored per step."""
    steps = messages // 2

    def reply(state: Any) -> dict[str, Any]:
        step = len(state["messages"]) // 2
        return {"messages": [AIMessage(_text("assistant", step, message_chars), id=f"a{step}")]}

    with tempfile.TemporaryDirectory() as tmp:
        async with (
            open_connections(Database.parse(f"sqlite:///{Path(tmp) / 'bench.db'}")) as connections,
            open_checkpointer(connections) as saver,
        ):
            builder: StateGraph[Any] = StateGraph(messages_state_schema(mode))
            builder.add_node("reply", reply)
            builder.add_edge(START, "reply")
            builder.add_edge("reply", END)
            graph = builder.compile(checkpointer=saver)
            config = mark_checkpoint_mode(checkpoint_config(THREAD), mode)
            conn = saver.conn  # type: ignore[attr-defined]
            per_step: list[int] = []
            stored = 0
            for step in range(steps):
                user = HumanMessage(_text("user", step, message_chars), id=f"u{step}")
                await graph.ainvoke({"messages": [user]}, config)
                async with conn.execute(_STORED_BYTES_SQL, (THREAD, THREAD)) as cur:
                    now = int((await cur.fetchone())[0])
                per_step.append(now - stored)
                stored = now
            accessor = StateAccessor(graph, saver, mode=mode)
            started = time.perf_counter()
            head = await accessor.aget(THREAD)
            read_ms = (time.perf_counter() - started) * 1000
    assert head is not None and len(head.values["messages"]) == 2 * steps
    tail = per_step[-50:]
    return {
        "mode": mode,
        "messages": 2 * steps,
        "steps": steps,
        "total_bytes": stored,
        "bytes_per_step_last_50": sum(tail) / len(tail),
        "head_read_ms": read_ms,
        "per_step": per_step,
    }


def measure_checkpoint_bytes(
    mode: CheckpointMode, messages: int = 400, *, message_chars: int = 400
) -> dict[str, Any]:
    """Synchronous ``ameasure_checkpoint_bytes`` (not for use inside a running event loop)."""
    return asyncio.run(ameasure_checkpoint_bytes(mode, messages, message_chars=message_chars))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--chars", type=int, default=400, help="characters per message")
    args = parser.parse_args()
    rows = {
        mode: measure_checkpoint_bytes(mode, args.messages, message_chars=args.chars)
        for mode in ("full", "delta")
    }
    print(
        f"{'mode':<6} {'steps':>6} {'total bytes':>13} {'bytes/step (last 50)':>21} "
        f"{'head read ms':>13}"
    )
    for row in rows.values():
        print(
            f"{row['mode']:<6} {row['steps']:>6} {row['total_bytes']:>13,} "
            f"{row['bytes_per_step_last_50']:>21,.0f} {row['head_read_ms']:>13.1f}"
        )
    full, delta = rows["full"], rows["delta"]
    print(
        f"ratio full/delta: total {full['total_bytes'] / delta['total_bytes']:.1f}x, "
        f"last 50 steps {full['bytes_per_step_last_50'] / delta['bytes_per_step_last_50']:.1f}x"
    )


if __name__ == "__main__":
    main()
