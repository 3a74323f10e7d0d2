"""What compaction does to a long run: request size per turn, and checkpoint bytes per turn.

One invocation runs the same N-turn scripted run (default 300; each turn writes a new file, so the
thread grows by an assistant message and a tool result per turn) three times through the real
graph the harness builds (the default lead chain, the strict scripted model, the SQLite
checkpointer the runtime uses):

* **without compaction** (``limits.summarization`` off), full checkpoint mode;
* **with compaction** (``trigger_messages`` / ``keep_messages`` below), full mode;
* **with compaction**, ``delta`` mode — the durable channels (``compaction``, ``original_request``,
  ``delegations``, ``skills``) in play.

It prints ONE table: per sampled turn, the lead's request as the model received it (estimated
tokens, four characters per token, and message count, from a callback on every model call) without
and with compaction, and the checkpoint bytes that turn cost in full and in delta mode (what SQLite
stores for the thread: checkpoint blobs and metadata plus ``writes`` rows, as
``benchmarks/checkpoint_bytes.py`` measures); then the maxima, the means and the totals. Both
compaction runs must end in the same state and send the same requests, which the script checks.

Run ``python benchmarks/context.py [--turns N] [--every K] [--trigger M] [--keep K] [--chars C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig

from agentkeel.config import KeelConfig
from agentkeel.database import Database
from agentkeel.harness.agents import Harness
from agentkeel.harness.context import RunContext
from agentkeel.harness.durable import durable_values
from agentkeel.harness.state import CheckpointMode
from agentkeel.harness.token_estimate import messages_tokens
from agentkeel.runtime.checkpoints import checkpoint_config, mark_checkpoint_mode, open_checkpointer
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.usage import caller_from_tags

PROMPT = "Write one note per step into /workspace/notes, then say you are done."
MODEL = "bench"
LIFTED = 1_000_000
SUMMARY_CALLER = "middleware:summarization"
_STORED_BYTES_SQL = """
SELECT
  (SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints WHERE thread_id = ?)
  + (SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE thread_id = ?)
"""


def script(turns: int, chars: int) -> str:
    """The run: ``turns`` turns that each write a new note of about ``chars`` characters, a final
    answer, and the summary calls' own list (``summarization:``)."""
    body = ("Findings of step {turn}: " + "the figures hold and the next source agrees. " * (chars // 45 + 1))[:chars]
    return f"""\
strict: true
fallback: error
agents:
  lead:
    - say: "Step {{turn}}: writing note {{turn}}."
      tool_calls: [{{name: write_file, args: {{path: "/workspace/notes/{{turn}}.md", content: "{body}"}}}}]
      repeat: {turns}
    - say: "Done: {turns} notes written."
  summarization:
    - say: "Summary {{turn}}: the agent is writing one note per step into /workspace/notes; every note so far was written and confirmed; the next step writes the next note."
      repeat: forever
"""


def bench_config(directory: Path, turns: int, chars: int, *, compaction: bool, trigger: int, keep: int,
                 mode: CheckpointMode) -> KeelConfig:
    path = directory / "script.yaml"
    path.write_text(script(turns, chars))
    limit = 4 * turns + 20  # model, tools and the summarization hook's node per turn, and slack
    return KeelConfig(
        data_dir=str(directory / "data"),
        checkpoint_mode=mode,
        models=[{"name": MODEL, "use": "scripted", "script": str(path)}],
        limits={
            "recursion_limit": limit, "max_recursion_limit": max(1000, limit),
            # One write per turn on purpose: lift the guards that would (rightly) stop the workload.
            "loop_detection": {"tool_freq_warn": LIFTED, "tool_freq_hard_limit": LIFTED},
            "turn_limit": {"max_turns": turns + 10},
            "token_budget": {"max_tokens": 1_000_000_000},
            "summarization": {"enabled": compaction, "trigger_messages": trigger, "keep_messages": keep}
            if compaction else {"enabled": False},
        },
        base_dir=directory,
    )


@dataclass
class Request:
    caller: str
    messages: int
    tokens: int


class RequestRecorder(BaseCallbackHandler):
    """Every chat-model request of the run, as the model receives it (after every middleware)."""

    run_inline = True

    def __init__(self) -> None:
        self.requests: list[Request] = []

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *,
                            run_id: UUID, tags: list[str] | None = None, **kwargs: Any) -> None:
        request = messages[0] if messages else []
        self.requests.append(Request(caller_from_tags(tags), len(request), messages_tokens(request)))


@dataclass
class Measured:
    compaction: bool
    mode: CheckpointMode
    lead: list[Request]  # one per lead model call, in order
    summaries: list[Request]
    turn_bytes: list[int]  # checkpoint bytes added per lead turn
    total_bytes: int
    messages: int  # in the thread at the end
    final: dict[str, Any] = field(default_factory=dict)  # messages and durable channels, comparable


def _comparable(values: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The final state without what differs between two runs of the same script (ids, times)."""
    def text(value: Any) -> str:  # a scripted session's ids carry the run id's first eight characters
        return str(value).replace(run_id, "RUN").replace(run_id[:8], "RUN")

    messages = [(m.type, text(m.content), text(getattr(m, "tool_calls", ""))) for m in values["messages"]]
    durable = durable_values(values)
    compaction = durable["compaction"] or {}
    return {
        "messages": messages,
        "compaction": {k: compaction.get(k) for k in ("summary", "compacted", "generation")},
        "original_request": (durable["original_request"] or {}).get("text"),
        "delegations": durable["delegations"], "skills": durable["skills"],
    }


async def measure(turns: int, *, compaction: bool, mode: CheckpointMode, trigger: int, keep: int,
                  chars: int) -> Measured:
    with tempfile.TemporaryDirectory(prefix="keel-context-") as tmp:
        directory = Path(tmp)
        config = bench_config(directory, turns, chars, compaction=compaction, trigger=trigger, keep=keep, mode=mode)
        harness = Harness(config, mode)
        resolved = harness.resolve("lead")
        run_id, thread_id = uuid.uuid4().hex, f"bench-{uuid.uuid4().hex[:8]}"
        recorder = RequestRecorder()
        run_config: RunnableConfig = mark_checkpoint_mode({
            **checkpoint_config(thread_id), "recursion_limit": config.limits.recursion_limit,
            "metadata": {"run_id": run_id, "assistant_id": "lead"}, "callbacks": [recorder],
        }, mode)
        workspace = directory / "workspace"
        (workspace / "notes").mkdir(parents=True)
        context = RunContext(thread_id=thread_id, run_id=run_id, workspace_root=workspace)
        async with (
            open_connections(Database.parse(f"sqlite:///{directory / 'bench.db'}")) as connections,
            open_checkpointer(connections) as saver,
        ):
            built = await harness.build(resolved, run_config)
            graph = built.graph.copy(update={"checkpointer": saver})
            context = dataclasses.replace(context, run_scope=built.scope)
            conn = saver.conn  # type: ignore[attr-defined]

            async def stored() -> int:
                async with conn.execute(_STORED_BYTES_SQL, (thread_id, thread_id)) as cur:
                    row = await cur.fetchone()
                return int(row[0]) if row else 0

            turn_bytes: list[int] = []
            before = 0
            async for update in graph.astream(
                {"messages": [{"role": "user", "content": PROMPT}]}, run_config, context=context,
                stream_mode="updates", durability="sync",
            ):
                if "tools" in update or ("model" in update and len(turn_bytes) == turns):
                    now = await stored()  # a turn ends with its tool results (the last with the answer)
                    turn_bytes.append(now - before)
                    before = now
            total = await stored()
            values = (await graph.aget_state(run_config)).values
    lead = [r for r in recorder.requests if r.caller != SUMMARY_CALLER]
    summaries = [r for r in recorder.requests if r.caller == SUMMARY_CALLER]
    assert len(lead) == turns + 1, f"{len(lead)} lead model calls, expected {turns + 1}"
    assert len(values["messages"]) == 2 * turns + 2, len(values["messages"])
    assert (values.get("compaction") is not None) == compaction, values.get("compaction")
    return Measured(compaction, mode, lead, summaries, turn_bytes, total, len(values["messages"]),
                    _comparable(values, run_id))


async def arun(turns: int, every: int, trigger: int, keep: int, chars: int) -> dict[str, Measured]:
    options = {"trigger": trigger, "keep": keep, "chars": chars}
    runs = {
        "plain": await measure(turns, compaction=False, mode="full", **options),
        "full": await measure(turns, compaction=True, mode="full", **options),
        "delta": await measure(turns, compaction=True, mode="delta", **options),
    }
    full, delta = runs["full"], runs["delta"]
    assert full.final == delta.final, "full and delta mode ended in different states"
    assert [(r.messages, r.tokens) for r in full.lead] == [(r.messages, r.tokens) for r in delta.lead], \
        "full and delta mode sent different requests"
    return runs


def report(runs: dict[str, Measured], turns: int, every: int) -> str:
    plain, full, delta = runs["plain"], runs["full"], runs["delta"]
    sampled = sorted({1, *range(every, turns + 1, every), turns})
    head = (f"{'turn':>6} | {'no compaction':>17} | {'compaction':>17} | {'checkpoint bytes/turn':>23}\n"
            f"{'':>6} | {'tokens':>9} {'msgs':>7} | {'tokens':>9} {'msgs':>7} | {'full':>11} {'delta':>11}")
    lines = [head, "-" * len(head.splitlines()[1])]
    for turn in sampled:
        i = turn - 1
        lines.append(
            f"{turn:>6} | {plain.lead[i].tokens:>9,} {plain.lead[i].messages:>7} | "
            f"{full.lead[i].tokens:>9,} {full.lead[i].messages:>7} | "
            f"{full.turn_bytes[i]:>11,} {delta.turn_bytes[i]:>11,}"
        )
    lines.append("-" * len(head.splitlines()[1]))
    lines.append(
        f"{'max':>6} | {max(r.tokens for r in plain.lead):>9,} {max(r.messages for r in plain.lead):>7} | "
        f"{max(r.tokens for r in full.lead):>9,} {max(r.messages for r in full.lead):>7} | "
        f"{max(full.turn_bytes):>11,} {max(delta.turn_bytes):>11,}"
    )
    mean = lambda values: sum(values) / max(len(values), 1)  # noqa: E731
    lines.append(
        f"{'mean':>6} | {mean([r.tokens for r in plain.lead]):>9,.0f} {mean([r.messages for r in plain.lead]):>7.0f} | "
        f"{mean([r.tokens for r in full.lead]):>9,.0f} {mean([r.messages for r in full.lead]):>7.0f} | "
        f"{mean(full.turn_bytes):>11,.0f} {mean(delta.turn_bytes):>11,.0f}"
    )
    lines.append(
        f"{'total':>6} | {sum(r.tokens for r in plain.lead):>9,} {'':>7} | "
        f"{sum(r.tokens for r in full.lead):>9,} {'':>7} | {full.total_bytes:>11,} {delta.total_bytes:>11,}"
    )
    lines.append(
        f"{turns} turns + the final answer; thread {full.messages} messages at the end in every run; "
        f"{len(full.summaries)} summary calls (largest {max((r.tokens for r in full.summaries), default=0):,} "
        f"tokens); bytes full/delta {full.total_bytes / max(delta.total_bytes, 1):.1f}x; "
        f"total request tokens without/with compaction "
        f"{sum(r.tokens for r in plain.lead) / max(sum(r.tokens for r in full.lead), 1):.1f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Measured]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="print every K-th turn")
    parser.add_argument("--trigger", type=int, default=40, help="limits.summarization.trigger_messages")
    parser.add_argument("--keep", type=int, default=20, help="limits.summarization.keep_messages")
    parser.add_argument("--chars", type=int, default=400, help="characters of each note written")
    args = parser.parse_args(argv)
    runs = asyncio.run(arun(args.turns, args.every, args.trigger, args.keep, args.chars))
    print(report(runs, args.turns, args.every))
    return runs


if __name__ == "__main__":
    main()
