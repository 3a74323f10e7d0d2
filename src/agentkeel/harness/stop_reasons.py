"""Stop reasons: why a run ended where it did, as data (see ``shared/spec/stop-reasons.md``).

A run's status says whether it ended and how; its stop reasons say why. Guards never write a
shared key: they report to the run's one ``StopReasonCollector`` (single writer), which stamps the
causal ``seq``, publishes a ``stop_reason`` stream event and a journal record per entry.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

STOP_REASON_CLASSES: dict[str, str] = {
    "cancelled": "cancellation",
    "interrupted_by_new_run": "cancellation",
    "rolled_back": "cancellation",
    "client_disconnected": "cancellation",
    "worker_lost": "ownership",
    "lease_lost": "ownership",
    "safety_capped": "safety",
    "token_capped": "budget",
    "turn_capped": "budget",
    "timeout": "budget",
    "loop_capped": "loop",
    "tool_blocked": "loop",
    "subagent_limit_capped": "limit",
    "model_length_capped": "limit",
    "context_length_capped": "limit",  # the provider refused the request as over the context window
    "recursion_capped": "limit",
    "clarification_requested": "delivery",
}

# A cancellation or ownership entry changes what the result means, so it outranks the rest.
_OUTRANKING_CLASSES = frozenset({"cancellation", "ownership"})

# Entries with the same ``cause`` (one model response, one tool call) happened at one causal
# instant; which guard recorded first there depends only on middleware order, so it must not decide
# the primary. Among them the root cause wins: a provider safety stop explains a truncated call,
# which explains a budget or loop cap on the same response.
CAUSE_PRECEDENCE: tuple[str, ...] = (
    "safety_capped",
    "model_length_capped",
    "clarification_requested",
    "token_capped",
    "turn_capped",
    "loop_capped",
    "tool_blocked",
    "subagent_limit_capped",
)


@dataclass(frozen=True)
class StopReason:
    code: str
    source: str
    seq: int
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    klass: str = ""
    cause: str | None = None  # what triggered it (a message or tool call id); see CAUSE_PRECEDENCE

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["class"] = out.pop("klass") or STOP_REASON_CLASSES.get(self.code, "limit")
        if out["cause"] is None:
            del out["cause"]
        return out


def _precedence(code: str) -> int:
    return CAUSE_PRECEDENCE.index(code) if code in CAUSE_PRECEDENCE else len(CAUSE_PRECEDENCE)


def primary_code(entries: Iterable[dict[str, Any]]) -> str | None:
    """The primary code: lowest ``seq``, except that cancellation/ownership outrank every class.

    Entries sharing a ``cause`` count as recorded at the seq of the first of them and are then
    ordered by :data:`CAUSE_PRECEDENCE`, so re-ordering middleware cannot change the primary.
    Unknown codes are tolerated (their ``class`` field, if any, is used).
    """
    items = list(entries)
    first_seq: dict[str, int] = {}
    for entry in items:
        cause = entry.get("cause")
        if isinstance(cause, str):
            seq = int(entry.get("seq", 0))
            first_seq[cause] = min(seq, first_seq.get(cause, seq))
    best: tuple[int, int, int, int] | None = None
    code: str | None = None
    for entry in items:
        klass = entry.get("class") or STOP_REASON_CLASSES.get(entry.get("code", ""), "")
        seq = int(entry.get("seq", 0))
        cause = entry.get("cause")
        instant = first_seq.get(cause, seq) if isinstance(cause, str) else seq
        rank = (0 if klass in _OUTRANKING_CLASSES else 1, instant, _precedence(entry.get("code", "")), seq)
        if best is None or rank < best:
            best, code = rank, entry.get("code")
    return code


Emit = Callable[[dict[str, Any]], Awaitable[None]]


class StopReasonCollector:
    """The single writer of a run's stop reasons.

    ``next_seq`` yields the run-wide journal sequence at the moment of recording, so entries are in
    causal order with everything else the journal saw. ``emit`` publishes the stream event and the
    journal record; it is awaited by ``record`` and failures there never lose the entry.
    """

    def __init__(self, next_seq: Callable[[], int], emit: Emit | None = None) -> None:
        self._next_seq = next_seq
        self._emit = emit
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    async def record(
        self,
        code: str,
        source: str,
        detail: str = "",
        data: dict[str, Any] | None = None,
        klass: str | None = None,
        cause: str | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            entry = StopReason(
                code=code,
                source=source,
                seq=self._next_seq(),
                detail=detail,
                data=dict(data or {}),
                klass=klass or STOP_REASON_CLASSES.get(code, "limit"),
                cause=cause,
            ).to_dict()
            self._entries.append(entry)
        if self._emit is not None:
            await self._emit(entry)
        return entry

    def extend(self, entries: list[dict[str, Any]]) -> None:
        """Carry entries recorded earlier (a lost attempt's, rebuilt from its journal)."""
        with self._lock:
            self._entries.extend(dict(e) for e in entries)

    def child(self) -> StopReasonCollector:
        """A collector for one subagent of this run: its own entries, stamped from the same
        run-wide sequence (so the parent can append them in causal order), published nowhere."""
        return StopReasonCollector(self._next_seq)

    def has(self, code: str) -> bool:
        return any(e["code"] == code for e in self._entries)

    @classmethod
    def standalone(cls) -> StopReasonCollector:
        """A collector with its own counter, for a graph run outside the runtime (tests, scripts)."""
        return cls(itertools.count(1).__next__)

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self._entries)

    @property
    def primary(self) -> str | None:
        return primary_code(self._entries)
