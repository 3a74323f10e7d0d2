"""What a subagent's delegating agent receives: text for its model, and the outcome as data.

Why both: the model needs prose ("completed, but capped by the loop guard: here is what it
wrote"); everything else — the delegation ledger, the run's stop reasons, the run ledger, the
console — needs fields it can trust without parsing prose. DeerFlow learned that a cap is a stop
reason, not a status: a child stopped by a guard with a partial answer is ``completed`` with its
reason, never a bare failure, so the lead can tell "broken" from "out of budget" and reuse the
partial work knowingly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import ToolMessage

from agentkeel.harness.middleware.keys import SUBAGENT_RESULT
from agentkeel.harness.stop_reasons import primary_code

Status = Literal["completed", "failed", "cancelled", "timed_out"]
STATUSES: tuple[Status, ...] = ("completed", "failed", "cancelled", "timed_out")

BRIEF_CHARS = 2000
"""The bound of the result brief carried as data (head and tail of the result)."""

_CAP_LABELS = {
    "loop_capped": "repeated tool-call loop",
    "token_capped": "token budget",
    "turn_capped": "turn limit",
    "tool_blocked": "a tool stopped producing value",
    "recursion_capped": "graph step limit",
    "model_length_capped": "model output length",
    "safety_capped": "provider safety stop",
    "subagent_limit_capped": "delegation limit",
    "context_length_capped": "context window",
}


def brief_of(text: str, limit: int = BRIEF_CHARS) -> str:
    """``text`` bounded to ``limit`` characters: two thirds head, one third tail."""
    if len(text) <= limit:
        return text
    marker = "\n...\n"
    head = (limit - len(marker)) * 2 // 3
    tail = limit - len(marker) - head
    return text[:head] + marker + text[-tail:]


@dataclass
class SubagentOutcome:
    """How one delegated task ended. ``result`` is the child's last answer (possibly partial)."""

    task_id: str
    subagent_type: str
    description: str
    status: Status
    result: str = ""
    error: str | None = None
    stop_reasons: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "calls": 0})
    model: str | None = None
    files_changed: list[str] = field(default_factory=list)
    turns: int = 0
    duration_s: float = 0.0

    @property
    def stop_reason(self) -> str | None:
        return primary_code(self.stop_reasons)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.result.encode("utf-8")).hexdigest()

    def data(self) -> dict[str, Any]:
        """The outcome as data: the ``subagent.end`` journal record and the task result's metadata."""
        return {
            "task_id": self.task_id,
            "subagent_type": self.subagent_type,
            "description": self.description,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "stop_reasons": list(self.stop_reasons),
            "usage": dict(self.usage),
            "model": self.model,
            "files_changed": list(self.files_changed),
            "brief": brief_of(self.result),
            "sha256": self.sha256,
            "turns": self.turns,
            "duration_s": round(self.duration_s, 3),
            "error": self.error,
        }

    def text(self) -> str:
        """What the delegating model reads."""
        capped = ", ".join(_CAP_LABELS.get(c, c) for c in dict.fromkeys(e.get("code", "") for e in self.stop_reasons))
        cap = f" (capped: {capped})" if capped else ""
        body = self.result.strip()
        if self.status == "completed":
            return f"Task completed{cap}. Result:\n{body or 'No response generated.'}"
        head = {
            "failed": "Task failed",
            "cancelled": "Task cancelled",
            "timed_out": f"Task timed out after {self.duration_s:.0f} s",
        }[self.status]
        error = f": {self.error}" if self.error else ""
        partial = f"\nPartial result:\n{body}" if body else ""
        return f"{head}{cap}{error}.{partial}"

    def message(self) -> ToolMessage:
        """The ``task`` tool's result: the text, with the outcome as data on ``artifact``."""
        return ToolMessage(
            content=self.text(),
            tool_call_id=self.task_id,
            name="task",
            status="success" if self.status == "completed" else "error",
            artifact={SUBAGENT_RESULT: self.data()},
        )


__all__ = ["BRIEF_CHARS", "STATUSES", "Status", "SubagentOutcome", "brief_of"]
