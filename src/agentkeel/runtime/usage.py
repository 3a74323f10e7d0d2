"""Token accounting for one run: totals, per caller class, per agent and per model.

The run resource's ``usage`` field (``shared/spec/interfaces.md``) comes from :meth:`as_dict`.
Calls are counted once per LangChain run id (``source_id``), because the same model call can be
reported twice — by the run's callback handler and by a subagent's result forwarded to the parent.
Input tokens are counted as seriously as output tokens: the costly runs are the ones that re-send a
growing context every turn, not the ones that write much.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentkeel.harness.middleware.keys import SUBAGENT_TYPE_METADATA

LEAD = "lead"
CALLER_CLASSES = (LEAD, "subagent", "middleware")


def caller_from_tags(tags: Iterable[str] | None, metadata: Mapping[str, Any] | None = None) -> str:
    """The caller a LangChain run's tags name: ``lead``, ``subagent:<type>`` or ``middleware:<name>``.

    The *last* matching tag wins: LangChain lists inherited tags before the run's own, so a subagent
    started inside a run tagged ``lead`` carries ``["lead", "subagent:<type>"]`` and must count as the
    subagent. Untagged calls are the lead's. A nested subagent's calls carry two ``subagent:*`` tags
    whose order LangChain does not keep (its config merge sorts tags), so when the winner is a
    subagent, the innermost one is read from ``metadata`` (``SUBAGENT_TYPE_METADATA``) instead.
    """
    caller = LEAD
    for tag in tags or ():
        if tag == LEAD or tag.startswith(("subagent:", "middleware:")):
            caller = tag
    innermost = (metadata or {}).get(SUBAGENT_TYPE_METADATA)
    if caller.startswith("subagent:") and isinstance(innermost, str) and innermost:
        return f"subagent:{innermost}"
    return caller


def caller_class(caller: str) -> str:
    """``subagent:<type>`` -> ``subagent``, ``middleware:<name>`` -> ``middleware``, else ``lead``."""
    prefix = caller.split(":", 1)[0]
    return prefix if prefix in CALLER_CLASSES else LEAD


@dataclass
class _Tally:
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    def add(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.calls += 1

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
            "calls": self.calls,
        }


class UsageAccumulator:
    """Thread-safe running totals (sync LangChain callbacks may report from worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._total = _Tally()
        self._by_class = {name: _Tally() for name in CALLER_CLASSES}
        self._by_agent: dict[str, _Tally] = {}
        self._by_model: dict[str, _Tally] = {}
        self._by_task: dict[str, _Tally] = {}

    def add(
        self,
        caller: str,
        model: str,
        input_tokens: int | None,
        output_tokens: int | None,
        source_id: str | None = None,
        task_id: str | None = None,
    ) -> bool:
        """Count one model call; False if ``source_id`` was already counted. ``task_id``: the
        delegated task whose subagent made the call (counted on its own too, for its outcome)."""
        tokens_in, tokens_out = max(int(input_tokens or 0), 0), max(int(output_tokens or 0), 0)
        with self._lock:
            if source_id is not None:
                if source_id in self._seen:
                    return False
                self._seen.add(source_id)
            for tally in (
                self._total,
                self._by_class[caller_class(caller)],
                self._by_agent.setdefault(caller, _Tally()),
                self._by_model.setdefault(model or "unknown", _Tally()),
                *([self._by_task.setdefault(task_id, _Tally())] if task_id else []),
            ):
                tally.add(tokens_in, tokens_out)
            return True

    def of_task(self, task_id: str) -> dict[str, int]:
        """The calls of one delegated task's subagent (zeros when it made none)."""
        with self._lock:
            return (self._by_task.get(task_id) or _Tally()).as_dict()

    @property
    def input_tokens(self) -> int:
        with self._lock:
            return self._total.input_tokens

    @property
    def output_tokens(self) -> int:
        with self._lock:
            return self._total.output_tokens

    @property
    def total_tokens(self) -> int:
        with self._lock:
            return self._total.input_tokens + self._total.output_tokens

    def as_dict(self) -> dict[str, Any]:
        """The run resource's ``usage``: totals, ``by_caller`` (lead/subagent/middleware, always all
        three), ``by_model``, and ``by_agent`` keyed by the full caller string."""
        with self._lock:
            total = self._total.as_dict()
            return {
                "input_tokens": total["input_tokens"],
                "output_tokens": total["output_tokens"],
                "total_tokens": total["total_tokens"],
                "by_caller": {name: t.as_dict() for name, t in self._by_class.items()},
                "by_model": {name: t.as_dict() for name, t in sorted(self._by_model.items())},
                "by_agent": {name: t.as_dict() for name, t in sorted(self._by_agent.items())},
            }
