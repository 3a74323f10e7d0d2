"""Running delegated tasks: on the run's own event loop, bounded, and never at a sibling's expense.

One executor serves one agent of one run (the lead, or a subagent allowed to delegate further).
For each ``task`` call it:

1. resolves the type and claims the child's model *before* any wait, so a scripted child's
   instance number follows the order of the calls, not the order the scheduler woke them;
2. waits for one of the agent's ``max_concurrent`` slots, then for one of the process's
   ``process_capacity`` slots (:class:`~agentkeel.harness.subagents.capacity.Capacity`, FIFO);
3. starts the child's clock only then (``timeout_s``), and runs the child's graph as a nested
   graph of the run: same event loop, same task, so the run's lease, fence and cancellation
   cover it with nothing to forward — a run that is cancelled or loses its lease cancels every
   child with it;
4. settles, however the child ended — answer, cap, failure, its time limit, the run's cancel: the
   outcome is journaled (``subagent.end``), the child's stop reasons are appended to the run's with
   ``source: subagent:<type>/<task_id>``, the outcome is left where the worker finds it when the
   run ends before its result reaches the ledger, and the ``task_finished`` event is sent.

A child's exception never escapes as an exception: in one tool step LangGraph cancels the sibling
tool calls of a call that raises, so a failing child would sink its siblings. It becomes a
``failed`` outcome. Only the run's own cancellation propagates, after settling — and a re-run's
``ToolReplayMiss`` (``harness/tool_replay.py``), which must fail the whole run, siblings and all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, ensure_config, patch_config
from langgraph.errors import GraphRecursionError

from agentkeel.harness.context import JournalSink, RunContext, TaskEvents
from agentkeel.harness.middleware.keys import SUBAGENT_TYPE_METADATA, TASK_ID_METADATA
from agentkeel.harness.middleware.responses import text_of
from agentkeel.harness.subagents.capacity import Capacity
from agentkeel.harness.subagents.outcome import SubagentOutcome, brief_of
from agentkeel.harness.subagents.types import MAX_DEPTH, SubagentType
from agentkeel.harness.token_estimate import messages_tokens
from agentkeel.harness.tool_replay import ToolReplayMiss

STEP_CHARS = 2000
"""The bound of a message's text (and of each tool call's arguments) in a ``task_step`` event."""

ROOT_DEPTH = 0


@dataclass
class ChildAgent:
    """A child ready to run: its compiled graph and the name of the model it calls."""

    graph: Any
    model_name: str


class TaskJournal:
    """The run's journal as one child's guards write to it: each record names the child's
    ``task_id`` (unless it names one itself), so a reader can tell parallel children's
    interventions and compactions apart (``runtime/timeline.py`` nests them under their task)."""

    def __init__(self, inner: JournalSink, task_id: str) -> None:
        self._inner = inner
        self.task_id = task_id

    def record(self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None) -> int:
        return self._inner.record(kind, self._named(data), caller)

    async def write_through(self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None) -> int:
        return await self._inner.write_through(kind, self._named(data), caller)

    def _named(self, data: dict[str, Any] | None) -> dict[str, Any]:
        """A record naming another task (a grandchild's start and end) names this one as its parent."""
        named = {"task_id": self.task_id, **(data or {})}
        if named["task_id"] != self.task_id:
            named.setdefault("parent_task_id", self.task_id)
        return named


class ChildFactory(Protocol):
    """Builds a subagent's graph (the harness does: same builder, chain kind ``subagent``)."""

    def __call__(self, spec: SubagentType, depth: int, executor: SubagentExecutor) -> ChildAgent: ...


class AgentTouches:
    """The run's change recorder, as seen by one child: every path it reports is attributed to
    ``agent`` and remembered for the child's outcome (``files_changed``)."""

    def __init__(self, inner: Any, agent: str) -> None:
        self._inner = inner
        self.agent = agent
        self.paths: list[str] = []

    def touched(
        self, virtual_path: str, tool_call_id: str | None, tool_name: str, after_sha256: str | None = None,
        agent: str | None = None,
    ) -> None:
        if virtual_path not in self.paths:
            self.paths.append(virtual_path)
        if self._inner is not None:
            self._inner.touched(virtual_path, tool_call_id, tool_name, after_sha256, agent=agent or self.agent)


class SubagentExecutor:
    """Runs the ``task`` calls of one agent; see the module docstring."""

    def __init__(
        self,
        types: dict[str, SubagentType],
        factory: ChildFactory,
        capacity: Capacity,
        max_concurrent: int,
        depth: int = ROOT_DEPTH,
        levels: int = MAX_DEPTH,
    ) -> None:
        self.types = types
        self.factory = factory
        self.capacity = capacity
        self.max_concurrent = max_concurrent
        self.depth = depth  # of the agent this executor serves (0: the lead)
        self.levels = levels  # delegation levels still allowed below that agent
        self._slots = asyncio.Semaphore(max_concurrent)

    async def run(
        self, description: str, prompt: str, subagent_type: str, task_id: str, ctx: RunContext,
        config: RunnableConfig | None, writer: Callable[[Any], None] | None = None,
    ) -> ToolMessage:
        spec = self.types.get(subagent_type)
        if spec is None:
            available = ", ".join(sorted(self.types))
            return SubagentOutcome(
                task_id, subagent_type, description, "failed",
                error=f"unknown subagent type {subagent_type!r}; available: {available}",
            ).message()
        try:
            child = self.factory(spec, self.depth + 1, self)  # claims the child's model now: see step 1
        except Exception as exc:  # e.g. the type's model is unusable here: a failed task, not a crash
            return SubagentOutcome(task_id, spec.name, description, "failed",
                                   error=f"the subagent could not be built: {type(exc).__name__}: {exc}").message()
        run = _ChildRun(self, spec, child, description, prompt, task_id, ctx, config, writer)
        return await run.execute()


class _ChildRun:
    """One child, start to settled outcome."""

    def __init__(
        self, executor: SubagentExecutor, spec: SubagentType, child: ChildAgent, description: str,
        prompt: str, task_id: str, ctx: RunContext, config: RunnableConfig | None,
        writer: Callable[[Any], None] | None,
    ) -> None:
        self.executor = executor
        self.spec = spec
        self.child = child
        self.prompt = prompt
        self.ctx = ctx
        self.caller = f"subagent:{spec.name}"
        self.source = f"{self.caller}/{task_id}"
        self.reasons = ctx.stop_reasons.child()
        self.touches = AgentTouches(ctx.touches, self.source)
        self.outcome = SubagentOutcome(task_id, spec.name, description, "failed", model=child.model_name)
        self.messages: list[BaseMessage] = []
        self.steps = 0
        self.parent_config = ensure_config(config)
        self.namespace = str((self.parent_config.get("configurable") or {}).get("checkpoint_ns") or "")
        self.writer = writer

    async def execute(self) -> ToolMessage:
        requested = time.monotonic()
        executor = self.executor
        try:
            async with executor._slots, executor.capacity.slot():
                await self._started(time.monotonic() - requested)
                await self._run_child()
        except asyncio.CancelledError:
            self.outcome.status = "cancelled"
            self.outcome.error = "the delegating run was stopped"
            await _shielded(self._settle())
            raise
        except ToolReplayMiss:  # a re-run's call the recording does not hold: the whole run fails
            await self._settle()
            raise
        await self._settle()
        return self.outcome.message()

    async def _run_child(self) -> None:
        started = time.monotonic()
        outcome = self.outcome
        journal = TaskJournal(self.ctx.journal, outcome.task_id) if self.ctx.journal is not None else None
        # The lead's scope is not the child's: a child graph is built for its task alone.
        child_ctx = dataclasses.replace(self.ctx, stop_reasons=self.reasons, touches=self.touches, journal=journal,
                                        run_scope=None)
        config = self._child_config()
        try:
            deadline = asyncio.timeout(self.spec.timeout_s)
            try:
                async with deadline:
                    async for chunk in self.child.graph.astream(
                        {"messages": [HumanMessage(self.prompt)]}, config, context=child_ctx, stream_mode="values",
                    ):
                        await self._observe(chunk)
                outcome.status = "completed"
            except TimeoutError:
                if not deadline.expired():
                    raise  # a timeout inside the child that is not its own clock: a failure
                outcome.status = "timed_out"
                outcome.error = f"the subagent exceeded its time limit of {self.spec.timeout_s:g} s"
            except GraphRecursionError as exc:
                await self.reasons.record("recursion_capped", "executor", detail=str(exc),
                                          data={"recursion_limit": config.get("recursion_limit")})
                outcome.status = "completed" if self._answer() else "failed"
                outcome.error = None if outcome.status == "completed" else "the subagent reached its graph step limit"
        except asyncio.CancelledError:
            raise
        except ToolReplayMiss as exc:
            outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        except Exception as exc:  # never raise into the tool step: it would cancel the siblings
            outcome.status = "failed"
            outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            outcome.duration_s = time.monotonic() - started

    def _child_config(self) -> RunnableConfig:
        parent = self.parent_config
        config = patch_config(parent, recursion_limit=self.spec.max_turns * 4 + 10, run_name=self.caller)
        config["tags"] = [*(parent.get("tags") or []), self.caller]
        config["metadata"] = {**(parent.get("metadata") or {}), TASK_ID_METADATA: self.outcome.task_id,
                              SUBAGENT_TYPE_METADATA: self.spec.name}
        return config

    async def _observe(self, chunk: Any) -> None:
        messages = list(chunk.get("messages") or []) if isinstance(chunk, dict) else []
        known = {m.id for m in self.messages if m.id}
        fresh = [m for m in messages if isinstance(m, (AIMessage, ToolMessage)) and (not m.id or m.id not in known)]
        self.messages = messages
        for message in fresh:
            self.steps += 1
            await self._emit({"type": "task_step", "task_id": self.outcome.task_id, "step": self.steps,
                              "message": _step_view(message)})

    def _answer(self) -> str:
        last = next((m for m in reversed(self.messages) if isinstance(m, AIMessage)), None)
        return text_of(last).strip() if last is not None else ""

    async def _started(self, queued_s: float) -> None:
        data = {"task_id": self.outcome.task_id, "subagent_type": self.spec.name,
                "description": self.outcome.description, "model": self.child.model_name,
                "depth": self.executor.depth + 1, "queued_s": round(queued_s, 3)}
        self._journal("subagent.start", data)
        await self._emit({"type": "task_started", "namespace": self.namespace, **data})

    async def _settle(self) -> None:
        """Journal the end, append the child's reasons to the run's, leave the outcome for the
        worker and send ``task_finished`` — each step on its own, so one failing skips nothing."""
        outcome = self.outcome
        outcome.result = self._answer()
        outcome.turns = sum(1 for m in self.messages if isinstance(m, AIMessage))
        outcome.stop_reasons = self.reasons.entries
        outcome.files_changed = list(self.touches.paths)
        outcome.usage = self._usage()
        data = outcome.data()
        self.ctx.delegation_outcomes[outcome.task_id] = data
        self._journal("subagent.end", data)
        for entry in outcome.stop_reasons:
            await self.ctx.stop_reasons.record(
                entry["code"], self.source, detail=entry.get("detail", ""),
                data={**(entry.get("data") or {}), "subagent_seq": entry.get("seq")},
                klass=entry.get("class"), cause=outcome.task_id,
            )
        await self._emit({"type": "task_finished", **{k: data[k] for k in (
            "task_id", "subagent_type", "status", "stop_reason", "stop_reasons", "usage", "model",
            "files_changed", "brief", "turns", "duration_s", "error")}})

    def _usage(self) -> dict[str, int]:
        meter = self.ctx.usage
        if meter is not None:
            return meter.of_task(self.outcome.task_id)
        # Outside the runtime: what the child's own responses reported.
        ai = [m for m in self.messages if isinstance(m, AIMessage)]
        tokens_in = sum(m.usage_metadata["input_tokens"] for m in ai if m.usage_metadata)
        tokens_out = sum(m.usage_metadata["output_tokens"] for m in ai if m.usage_metadata)
        if not tokens_in and not tokens_out and ai:
            tokens_in, tokens_out = messages_tokens(self.messages), messages_tokens(ai)
        return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out,
                "calls": len(ai)}

    def _journal(self, kind: str, data: dict[str, Any]) -> None:
        journal = self.ctx.journal
        if journal is not None:
            try:
                journal.record(kind, data, caller=self.caller)
            except Exception:  # a journal problem never breaks the run
                pass

    async def _emit(self, payload: dict[str, Any]) -> None:
        try:
            if self.ctx.task_events is not None:
                await self.ctx.task_events.task_event(self.namespace, payload)
            elif self.writer is not None:
                self.writer(payload)
        except Exception:  # progress events are best effort; the outcome is not
            pass


def _step_view(message: BaseMessage) -> dict[str, Any]:
    """A bounded, JSON-ready view of one child message for a ``task_step`` event."""
    view: dict[str, Any] = {"type": message.type, "id": message.id, "text": brief_of(text_of(message), STEP_CHARS)}
    if isinstance(message, AIMessage) and message.tool_calls:
        view["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "args": brief_of(str(c.get("args")), STEP_CHARS)}
            for c in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        view.update(tool_call_id=message.tool_call_id, name=message.name, status=message.status)
    return view


async def _shielded(coro: Any) -> None:
    """Finish ``coro`` even while the surrounding task is being cancelled (once more)."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue
    task.result()


__all__ = ["AgentTouches", "ChildAgent", "ChildFactory", "SubagentExecutor", "TaskEvents"]
