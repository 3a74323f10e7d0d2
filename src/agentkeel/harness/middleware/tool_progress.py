"""Stop spending turns on a tool that stopped producing value.

A model that meets an empty search, a rate limit or the same page again tends to call the same
tool once more with a small variation, and a long run can burn most of its budget that way. A
credentials or configuration failure is worse: it can never succeed in this run. ToolProgress
watches each tool's verdicts (the ``TOOL_META`` stamp of ToolErrorHandling, which must be inner)
and runs a small state machine per (thread, tool):

``active`` → ``warned`` (after ``stagnation_threshold`` consecutive problems; a hint tells the model
to change course) → ``blocked`` (after ``warn_escalation`` more; at once for ``auth``/``config``).

A problem is an ``empty``, ``rate_limited`` or ``error`` verdict, or an ``ok`` result identical or
nearly identical to one of the tool's last three ok results; any other result resets the tool to
active. "Identical" is the digest of the whole result; "nearly identical" is a similarity over
*every* token of the whole result — words of any length, numbers and punctuation, each counted as
often as it occurs. A stripped word set (long words only, duplicates folded) made different files
equal: two files that differ only in their numbers and short words looked like the same output
again, and a plain write/read round-robin over five files got ``read_file`` blocked.
A blocked tool is not run again: its calls are answered with a ``[TOOL_BLOCKED]`` error, and the
block is recorded once as the stop reason ``tool_blocked``. Results another guard produced instead
of the tool (their stamp's ``source`` is that guard) say nothing about the tool and are ignored.

Hints go through a :class:`HintQueue`: appended at the end of the next model request, never into
state, and committed only once the provider answered (a retried call carries them again).
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.middleware.base import (
    HintQueue,
    KeelMiddleware,
    ModelHandler,
    ToolHandler,
    ToolResult,
    run_context,
)
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import TOOL_META, fingerprint
from agentkeel.harness.middleware.responses import text_of
from agentkeel.limits import ToolProgressLimits

Phase = Literal["active", "warned", "blocked"]

COUNTED_SOURCES = frozenset({"tool", "exception"})
RECENT_OK = 3
_TOKEN = re.compile(r"\w+|[^\w\s]")

# Why a tool is blocked, by the kind of its last problem.
BLOCK_REASONS: dict[str, str] = {
    "auth": "its credentials were rejected (authentication failed)",
    "config": "it is not configured or not available in this environment",
    "empty": "it kept returning no results",
    "rate_limited": "it kept being rate limited",
    "error": "it kept failing",
    "duplicate": "it kept returning the same output",
}
_PROBLEM_WORDS: dict[str, str] = {
    "empty": "returned no results",
    "rate_limited": "was rate limited",
    "error": "failed",
    "duplicate": "returned the same output as before",
}


Tokens = Counter[str]


def tokens(text: str) -> Tokens:
    """Every token of ``text`` with its count: runs of word characters (any length, digits
    included) and single punctuation marks, case kept. Nothing is dropped or folded."""
    return Counter(_TOKEN.findall(text))


def similarity(a: Tokens, b: Tokens) -> float:
    """Weighted Jaccard of two token multisets: shared occurrences over all occurrences."""
    union = sum((a | b).values())
    return sum((a & b).values()) / union if union else 1.0


@dataclass
class ToolPhase:
    """Progress state of one tool on one thread."""

    phase: Phase = "active"
    problems: int = 0
    reason: str = ""
    recent: deque[tuple[str, Tokens]] = field(default_factory=lambda: deque(maxlen=RECENT_OK))


class ToolProgress(KeelMiddleware):
    """Warns about, then blocks, tools that keep failing or repeating themselves."""

    contract = Contract(
        axes={
            "tool": on(requires={"tool_result.meta"}, reads={"tool_result.meta"}, mutates={"tool_result"}),
            "model": on(mutates={"model_request.messages"}),
        }
    )

    def __init__(self, limits: ToolProgressLimits) -> None:
        super().__init__()
        self.limits = limits
        self._exempt = frozenset(limits.exempt_tools)
        self._actions = frozenset(limits.action_tools)
        self._states: dict[tuple[str, str], ToolPhase] = {}
        self._hints = HintQueue("progress_hint")

    # -- model axis: deliver queued hints ----------------------------------------------------
    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        request, sent = self._hints.apply(request)
        response = await handler(request)
        self._hints.delivered(sent)
        return response

    # -- tool axis: block, or run and assess -------------------------------------------------
    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolResult:
        call = request.tool_call
        name = str(call.get("name") or "")
        if not name or name in self._exempt:
            return await handler(request)
        ctx = run_context(request.runtime)
        state = self._states.setdefault((ctx.thread_id if ctx else "", name), ToolPhase())
        if state.phase == "blocked":
            return self._blocked_result(name, str(call.get("id") or ""), state.reason)
        result = await handler(request)
        for message in _tool_messages(result):
            meta = message.additional_kwargs.get(TOOL_META)
            if not isinstance(meta, dict):
                raise RuntimeError(
                    f"ToolProgress: the result of tool {name!r} has no {TOOL_META!r} stamp. "
                    "ToolErrorHandling must run inner of ToolProgress (later in the middleware list)."
                )
            if meta.get("source") in COUNTED_SOURCES:
                await self._assess(request, name, state, meta, message)
        return result

    async def _assess(
        self, request: ToolCallRequest, name: str, state: ToolPhase, meta: dict[str, Any], message: ToolMessage
    ) -> None:
        if state.phase == "blocked":  # a parallel call of the same tool blocked it meanwhile
            return
        status = str(meta.get("status"))
        if status in ("auth", "config"):
            state.problems += 1
            await self._block(request, name, state, status)
            return
        kind = status if status in ("empty", "rate_limited", "error") else None
        if status == "ok" and name not in self._actions:
            text = text_of(message)
            fp, counted = str(meta.get("fingerprint") or fingerprint(text)), tokens(text)
            if self._near_duplicate(fp, counted, state):
                kind = "duplicate"
            state.recent.append((fp, counted))
        if kind is None:
            state.phase, state.problems = "active", 0
            return
        state.problems += 1
        limit = self.limits.stagnation_threshold
        if state.problems >= limit + self.limits.warn_escalation:
            await self._block(request, name, state, kind)
        elif state.problems >= limit:
            state.phase = "warned"
            self._hints.push(
                f"[PROGRESS HINT] {name} {_PROBLEM_WORDS[kind]} {state.problems} times in a row. "
                "Change the arguments substantially, use another tool, or continue with what you have. "
                f"If this goes on, {name} will be blocked for the rest of this run."
            )
            self.intervene(
                request.runtime, "warn", f"{name} {_PROBLEM_WORDS[kind]} {state.problems} times in a row",
                tool=name, kind=kind, problems=state.problems,
            )

    def _near_duplicate(self, fp: str, counted: Tokens, state: ToolPhase) -> bool:
        min_tokens, threshold = self.limits.min_words, self.limits.similarity
        size = counted.total()
        for old_fp, old in state.recent:
            if fp == old_fp:
                return True
            if min(size, old.total()) >= min_tokens and similarity(counted, old) >= threshold:
                return True
        return False

    async def _block(self, request: ToolCallRequest, name: str, state: ToolPhase, kind: str) -> None:
        state.phase, state.reason = "blocked", BLOCK_REASONS[kind]
        self._hints.push(
            f"[PROGRESS HINT] {name} is now blocked for the rest of this run: {state.reason}. "
            "Do not call it again; continue with the context you have or another tool."
        )
        detail = f"tool {name} blocked: {state.reason} ({state.problems} consecutive problems)"
        self.intervene(request.runtime, "block", detail, tool=name, kind=kind, problems=state.problems)
        # Once per tool: a blocked tool is never assessed again.
        await self.stop(
            request.runtime, "tool_blocked", detail,
            data={"tool": name, "reason": state.reason, "problems": state.problems},
            cause=str(request.tool_call.get("id") or "") or None,
        )

    def _blocked_result(self, name: str, tool_call_id: str, reason: str) -> ToolMessage:
        content = (
            f"[TOOL_BLOCKED] {name}: {reason}. The tool was not run. Do not call it again in this run; "
            "continue with the context you have or another tool."
        )
        meta = {"status": "error", "fingerprint": fingerprint(content), "source": self.name, "error_type": "tool_blocked"}
        return ToolMessage(
            content=content, name=name, tool_call_id=tool_call_id, status="error",
            additional_kwargs={TOOL_META: meta},
        )


def _tool_messages(result: Any) -> list[ToolMessage]:
    if isinstance(result, ToolMessage):
        return [result]
    if isinstance(result, Command) and isinstance(result.update, dict):
        return [m for m in result.update.get("messages") or [] if isinstance(m, ToolMessage)]
    return []


__all__ = ["BLOCK_REASONS", "ToolPhase", "ToolProgress", "similarity", "tokens"]
