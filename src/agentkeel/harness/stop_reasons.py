"""Stop reasons: why a run ended where it did, as data (see ``shared/spec/stop-reasons.md``).

A run's status says whether it ended and how; its stop reasons say why. Guards never write a
shared key: they report to the run's one ``StopReasonCollector`` (single writer), which stamps the
causal ``seq``, publishes a ``stop_reason`` stream event and a journal record per entry.
"""

from __future__ import annotations

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
    "recursion_capped": "limit",
    "clarification_requested": "delivery",
}

# A cancellation or ownership entry changes what the result means, so it outranks the rest.
_OUTRANKING_CLASSES = frozenset({"cancellation", "ownership"})


@dataclass(frozen=True)
class StopReason:
    code: str
    source: str
    seq: int
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    klass: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["class"] = out.pop("klass") or STOP_REASON_CLASSES.get(self.code, "limit")
        return out


def primary_code(entries: Iterable[dict[str, Any]]) -> str | None:
    """The primary code: lowest ``seq``, except that cancellation/ownership outrank every class.

    Unknown codes are tolerated (their ``class`` field, if any, is used).
    """
    best: tuple[int, int] | None = None
    code: str | None = None
    for entry in entries:
        klass = entry.get("class") or STOP_REASON_CLASSES.get(entry.get("code", ""), "")
        rank = (0 if klass in _OUTRANKING_CLASSES else 1, int(entry.get("seq", 0)))
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
    ) -> dict[str, Any]:
        with self._lock:
            entry = StopReason(
                code=code,
                source=source,
                seq=self._next_seq(),
                detail=detail,
                data=dict(data or {}),
                klass=klass or STOP_REASON_CLASSES.get(code, "limit"),
            ).to_dict()
            self._entries.append(entry)
        if self._emit is not None:
            await self._emit(entry)
        return entry

    def has(self, code: str) -> bool:
        return any(e["code"] == code for e in self._entries)

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self._entries)

    @property
    def primary(self) -> str | None:
        return primary_code(self._entries)
