"""The stream bridge interface: per-run event streams with resumable, honest replay.

A worker publishes a run's events; any number of subscribers (SSE responses, ``/wait`` handlers)
follow them, resuming after a ``Last-Event-ID`` when they reconnect. Memory and Redis Streams
implement the same contract and one conformance suite checks both.

What a subscriber receives is a sequence of ``StreamEvent`` items, told apart by ``kind`` or,
equivalently, by ``event`` (the three marker names are reserved: ``publish`` refuses them):

* ``data`` - a published event: ``event`` is the publisher's name, ``id`` is ``"<seq>-0"``, and
  ``seq`` counts 1, 2, 3... per run.
* ``gap`` - ``event="gap"``: events after the subscriber's position were trimmed before it read
  them. ``data = {"requested_after": <seq>, "resumed_at": <first retained seq>, "missed": <n>}``.
  At most one per trimmed stretch; the retained events follow. The SSE layer forwards it.
* ``heartbeat`` - ``event="__heartbeat__"``: nothing happened for one heartbeat interval.
* ``end`` - ``event="__end__"``: the stream is finished; always the last item.

Marker items carry no id, so forwarding one never moves a client's ``Last-Event-ID``. Their
``seq`` is the subscriber's position: every data event up to it was delivered or reported missing.

Why sequence numbers rather than Redis' time-based ids: with contiguous per-run seqs, a subscriber
detects trimming by comparing the first seq it reads with the one it expected, so a ``gap`` is
exact and needs no second, racy query for the stream's bounds - on either backend.

Why an explicit ``gap``: bounded retention means a reconnecting or slow client can miss events.
Replaying the retained suffix silently makes the client's view wrong without anyone knowing; a
``gap`` tells it to reload durable state (thread state, the journal) instead.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, ClassVar

HEARTBEAT_EVENT = "__heartbeat__"
GAP_EVENT = "gap"
END_EVENT = "__end__"
RESERVED_EVENTS = frozenset({HEARTBEAT_EVENT, GAP_EVENT, END_EVENT})

LIVE = "$"
"""``last_event_id`` value meaning "only what is published after I joined" (like XREAD's ``$``)."""

_FROM_START = frozenset({"-1", "-"})
# A seq, optionally in its stream-id form "<seq>-0". Bounded so int() never sees a huge string.
_EVENT_ID = re.compile(r"([0-9]{1,19})(?:-0)?")

READ_BATCH = 256
"""Most events one backend read returns, so a far-behind subscriber never copies a whole window."""


class EventKind(StrEnum):
    data = "data"
    gap = "gap"
    heartbeat = "heartbeat"
    end = "end"


_MARKER_KINDS = {
    GAP_EVENT: EventKind.gap,
    HEARTBEAT_EVENT: EventKind.heartbeat,
    END_EVENT: EventKind.end,
}


class InvalidEventId(ValueError):
    """A ``Last-Event-ID`` that is not one this bridge issued (nor a documented alias)."""


class StreamClosed(RuntimeError):
    """Publishing to a stream whose END was already published."""


class StreamGone(LookupError):
    """The stream a subscriber was following was deleted or expired under it.

    Raised instead of heart-beating forever on a stream that will never end (DeerFlow #4071):
    the consumer should answer from the durable run record.
    """


@dataclass(frozen=True)
class StreamEvent:
    id: str
    seq: int
    event: str
    raw: Any  # the data, or its JSON text when ``encoded``
    encoded: bool = False

    @cached_property
    def data(self) -> Any:
        """Decoded on first access: a run with no subscriber never pays for decoding (and the
        memory bridge retains compact strings rather than object graphs the GC must walk)."""
        return json.loads(self.raw) if self.encoded else self.raw

    @property
    def kind(self) -> EventKind:
        return _MARKER_KINDS.get(self.event, EventKind.data)


@dataclass(frozen=True)
class Batch:
    """One backend read: data events in seq order, and whether END follows the last of them."""

    events: list[StreamEvent]
    ended: bool


def format_event_id(seq: int) -> str:
    """The id of data event ``seq``: also a valid Redis stream id, so Redis stores it verbatim."""
    return f"{seq}-0"


def parse_event_id(last_event_id: str | None) -> int | None:
    """The seq to resume after (0 = from the start), or ``None`` for :data:`LIVE`.

    ``None``, ``"-1"``, ``"-"``, ``"0"`` and ``"0-0"`` mean the start; ``"N"`` and ``"N-0"`` mean
    after event N. Anything else raises ``InvalidEventId``: guessing a position for a malformed id
    (DeerFlow replayed or tailed, differently per backend) hides a client bug.
    """
    if last_event_id is None or last_event_id in _FROM_START:
        return 0
    if last_event_id == LIVE:
        return None
    match = _EVENT_ID.fullmatch(last_event_id)
    if match is None:
        raise InvalidEventId(f"malformed Last-Event-ID {last_event_id!r}")
    return int(match.group(1))


def encode_data(data: Any) -> str:
    """Compact JSON; values JSON cannot represent (datetimes, UUIDs...) become their ``str``."""
    return json.dumps(data, default=str, separators=(",", ":"), ensure_ascii=False)


def data_event(seq: int, event: str, payload: str) -> StreamEvent:
    """Both backends hand out decoded JSON, so a subscriber sees the same values on either."""
    return StreamEvent(format_event_id(seq), seq, event, payload, encoded=True)


def _marker(event: str, seq: int, data: Any = None) -> StreamEvent:
    return StreamEvent("", seq, event, data)


class Reader(ABC):
    """One subscription's access to one run's stream (backend-specific)."""

    @abstractmethod
    async def head(self) -> int:
        """The seq of the last event published so far (0 if none)."""

    @abstractmethod
    async def read(self, after: int, wait_s: float) -> Batch:
        """Retained events with seq > ``after``, waiting up to ``wait_s`` for some to appear.

        Returns an empty, not-ended batch on timeout. Raises ``StreamGone`` if the stream this
        reader saw disappeared.
        """


class StreamBridge(ABC):
    """Per-run event streams: bounded retention, TTL cleanup, resumable subscriptions."""

    cross_process: ClassVar[bool]
    """Whether a subscriber in another process sees this process's publishes."""

    def __init__(self, *, retention: int, ttl_s: float, heartbeat_s: float) -> None:
        if retention < 1:
            raise ValueError("retention must be at least 1")
        if ttl_s <= 0 or heartbeat_s <= 0:
            raise ValueError("ttl_s and heartbeat_s must be positive")
        self.retention = retention
        self.ttl_s = ttl_s
        self.heartbeat_s = heartbeat_s

    async def publish(self, run_id: str, event: str, data: Any) -> StreamEvent:
        """Append a data event with the run's next seq; raises ``StreamClosed`` after END."""
        if not event or event in RESERVED_EVENTS:
            raise ValueError(f"event name {event!r} is empty or reserved")
        return await self._append(run_id, event, encode_data(data))

    @abstractmethod
    async def _append(self, run_id: str, event: str, payload: str) -> StreamEvent:
        """Atomically take the next seq, store the event, trim to retention, refresh the TTL."""

    @abstractmethod
    async def publish_end(self, run_id: str) -> None:
        """Close the stream. Idempotent. END is kept apart from retention and never trimmed."""

    def subscribe(
        self, run_id: str, *, last_event_id: str | None = None, heartbeat_s: float | None = None
    ) -> AsyncGenerator[StreamEvent, None]:
        """Follow a run: retained events after ``last_event_id``, then live ones, then END.

        ``last_event_id`` is validated here, before iteration, so a bad header fails the request
        up front. :data:`LIVE` means events published after iteration starts; a cursor beyond the
        last published event counts as caught up. Subscribing never creates a stream: on one that
        does not exist yet the iterator heart-beats until something is published, so callers that
        must not wait on finished-and-reaped runs check ``exists`` and the durable record first.
        Close the iterator (``contextlib.aclosing``) when abandoning it early.
        """
        after = parse_event_id(last_event_id)
        wait_s = self.heartbeat_s if heartbeat_s is None else heartbeat_s
        if wait_s <= 0:
            raise ValueError("heartbeat_s must be positive")
        return self._follow(run_id, after, wait_s)

    async def _follow(
        self, run_id: str, after: int | None, wait_s: float
    ) -> AsyncGenerator[StreamEvent, None]:
        async with self._reader(run_id) as reader:
            head = await reader.head()
            cursor = head if after is None else min(after, head)
            while True:
                batch = await reader.read(cursor, wait_s)
                if batch.events and batch.events[0].seq > cursor + 1:
                    first = batch.events[0].seq
                    gap = {
                        "requested_after": cursor,
                        "resumed_at": first,
                        "missed": first - cursor - 1,
                    }
                    yield _marker(GAP_EVENT, first - 1, gap)
                for item in batch.events:
                    cursor = item.seq
                    yield item
                if batch.ended:
                    yield _marker(END_EVENT, cursor)
                    return
                if not batch.events:
                    yield _marker(HEARTBEAT_EVENT, cursor)

    @abstractmethod
    def _reader(self, run_id: str) -> AbstractAsyncContextManager[Reader]:
        """A reader for one subscription, held for the subscription's lifetime."""

    @abstractmethod
    async def exists(self, run_id: str) -> bool:
        """Whether the run's stream holds anything (events or END) and has not expired."""

    @abstractmethod
    async def delete(self, run_id: str) -> None:
        """Remove the stream now; its subscribers get ``StreamGone``."""

    @abstractmethod
    async def close(self) -> None:
        """Release resources (memory: drop every stream)."""
