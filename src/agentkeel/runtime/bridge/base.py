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
* ``end`` - ``event="__end__"``: the stream is finished; the last item.
* ``error`` - ``event="__cursor_ahead__"``: the subscriber's ``Last-Event-ID`` is beyond the last
  event the run's stream holds (an id of another run, or of a stream that was rebuilt by a
  publisher that was not seeded). It is the last item instead of END: saying "caught up" would
  leave the client waiting for events it will never be told it missed.
  ``data = {"error": "LastEventIdAhead", "message": ..., "last_event_id": <seq>, "head": <seq>}``.

Marker items carry no id, so forwarding one never moves a client's ``Last-Event-ID``. Their
``seq`` is the subscriber's position: every data event up to it was delivered or reported missing.

Why sequence numbers rather than Redis' time-based ids: with contiguous per-run seqs, a subscriber
detects trimming by comparing the first seq it reads with the one it expected, so a ``gap`` is
exact and needs no second, racy query for the stream's bounds - on either backend.

Why an explicit ``gap``: bounded retention means a reconnecting or slow client can miss events.
Replaying the retained suffix silently makes the client's view wrong without anyone knowing; a
``gap`` tells it to reload durable state (thread state, the journal) instead.

Why the publisher numbers the events: a run has a single owner, and that process remembers the
last seq it published (``last_seq``). Each append takes ``max(stream head, publisher's last) + 1``,
so a stream key that was deleted, expired or lost with a Redis restart continues where the owner
left off - its subscribers see a ``gap``, never an id reused for a different event. A run taken
over by another process continues from the previous owner's last seq via ``seed``. Counters are
dropped at END, so memory is bounded by the runs in flight.

Why a failed publish does not raise: the stream is a live view, the durable truth is in the run
record, checkpoints and journal. A backend fault is logged and counted (``publish_failures``) and
its seq is skipped, so observers learn about the loss as a ``gap`` once the backend is back. After
a fault, publishes fail fast for a while (``FAULT_BACKOFF_S``, doubling while faults continue)
instead of each waiting out a timeout.
"""

from __future__ import annotations

import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import orjson

from agentkeel.runtime.redaction import redact_bytes

log = logging.getLogger(__name__)

HEARTBEAT_EVENT = "__heartbeat__"
GAP_EVENT = "gap"
END_EVENT = "__end__"
CURSOR_AHEAD_EVENT = "__cursor_ahead__"
RESERVED_EVENTS = frozenset({HEARTBEAT_EVENT, GAP_EVENT, END_EVENT, CURSOR_AHEAD_EVENT})

LIVE = "$"
"""``last_event_id`` value meaning "only what is published after I joined" (like XREAD's ``$``)."""

_FROM_START = frozenset({"-1", "-"})
# A seq, optionally in its stream-id form "<seq>-0". Bounded so int() never sees a huge string.
_EVENT_ID = re.compile(r"([0-9]{1,19})(?:-0)?")

EVENT_OVERHEAD = 160
"""Bytes counted per retained event beyond its payload, name and coordinate (its object and id in
memory, its ids and field names in Redis): byte budgets are approximate by this much per event."""

READ_BATCH = 256
"""Most events one backend read returns, so a far-behind subscriber never copies a whole window."""

FAULT_BACKOFF_S = 1.0
"""After a backend fault, publishes within this long are counted as failed without trying; the
window doubles with each consecutive fault up to ``MAX_FAULT_BACKOFF_S`` and resets on success, so
a hung backend costs a run one timeout per window rather than one per event."""
MAX_FAULT_BACKOFF_S = 8.0


class EventKind(StrEnum):
    data = "data"
    gap = "gap"
    heartbeat = "heartbeat"
    end = "end"
    error = "error"


_MARKER_KINDS = {
    GAP_EVENT: EventKind.gap,
    HEARTBEAT_EVENT: EventKind.heartbeat,
    END_EVENT: EventKind.end,
    CURSOR_AHEAD_EVENT: EventKind.error,
}


class InvalidEventId(ValueError):
    """A ``Last-Event-ID`` that is not one this bridge issued (nor a documented alias)."""


class StreamClosed(RuntimeError):
    """Publishing to a stream whose END was already published."""


class TooManySubscribers(RuntimeError):
    """This process already serves its limit of stream subscribers (``stream_max_subscribers``).

    Refusing one more client is cheap and local; letting idle subscribers exhaust shared
    resources would make publishing - and so runs - fail instead.
    """


class BridgeFault(RuntimeError):
    """The backend could not be reached or answered with an error (connection, timeout...)."""


class StreamGone(LookupError):
    """The stream a subscriber was following was deleted or expired under it.

    Raised instead of heart-beating forever on a stream that will never end (DeerFlow #4071):
    the consumer should answer from the durable run record.
    """


@dataclass(frozen=True, slots=True)
class StreamEvent:
    id: str
    seq: int
    event: str
    raw: Any  # the data, or its JSON bytes when ``encoded``
    encoded: bool = False
    at: bytes = b""  # the run coordinate the publisher stamped (JSON bytes), empty when none

    @property
    def coordinate(self) -> dict[str, Any] | None:
        """``{run_id, attempt, step, journal_seq}`` at publish time (``runtime/timeline.py``
        aligns the stream with the journal and checkpoints by it); never sent to SSE clients."""
        return orjson.loads(self.at) if self.at else None

    @property
    def data(self) -> Any:
        """The data as objects, decoded at each access and never kept: only a consumer that needs
        objects pays for decoding, and a retained event stays its compact bytes (no decoded copy
        for the GC to walk)."""
        return orjson.loads(self.raw) if self.encoded else self.raw

    @property
    def json(self) -> bytes:
        """The data as JSON bytes: the published bytes themselves, never re-encoded."""
        return self.raw if self.encoded else encode_data(self.raw)

    @property
    def kind(self) -> EventKind:
        return _MARKER_KINDS.get(self.event, EventKind.data)


@dataclass(frozen=True)
class Batch:
    """One backend read: data events in seq order, and whether END follows the last of them.

    ``end_seq`` is the seq END was published after (when ``ended``): a subscriber behind it whose
    last events were lost gets a ``gap`` before END too."""

    events: list[StreamEvent]
    ended: bool
    end_seq: int = 0


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


_ENCODE_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME  # datetimes: their str, as ever


def encode_data(data: Any) -> bytes:
    """Compact UTF-8 JSON; values JSON cannot represent (datetimes, UUIDs...) become their ``str``."""
    return orjson.dumps(data, default=str, option=_ENCODE_OPTIONS)


def entry_size(event: str | bytes, payload: bytes, at: bytes = b"") -> int:
    """The bytes one retained event counts for against ``stream_run_max_bytes`` (the Redis append
    script computes the same sum)."""
    return len(payload) + len(event) + len(at) + EVENT_OVERHEAD


def data_event(seq: int, event: str, payload: bytes, at: bytes = b"") -> StreamEvent:
    """Both backends hand out the published JSON bytes, so a subscriber sees the same on either."""
    return StreamEvent(format_event_id(seq), seq, event, payload, encoded=True, at=at)


def _marker(event: str, seq: int, data: Any = None) -> StreamEvent:
    return StreamEvent("", seq, event, data)


def _gap(cursor: int, resumed_at: int) -> StreamEvent:
    """Events after ``cursor`` and before ``resumed_at`` will never be delivered."""
    gap = {"requested_after": cursor, "resumed_at": resumed_at, "missed": resumed_at - cursor - 1}
    return _marker(GAP_EVENT, resumed_at - 1, gap)


class Reader(ABC):
    """One subscription's access to one run's stream (backend-specific)."""

    @abstractmethod
    async def head(self) -> int | None:
        """The seq of the last event published so far (0 if none), ``None`` if there is no
        stream (not published yet, or lost)."""

    @abstractmethod
    async def read(self, after: int, wait_s: float) -> Batch:
        """Retained events with seq > ``after``, waiting up to ``wait_s`` for some to appear.

        Returns an empty, not-ended batch on timeout. Raises ``StreamGone`` if the stream this
        reader saw disappeared.
        """


class ThreadWatch(ABC):
    """One waiter's wake-ups for new runs of one thread (``StreamBridge.watch_thread``)."""

    @abstractmethod
    async def wait(self, timeout_s: float) -> bool:
        """Wait until a run is announced on the thread (``True``) or ``timeout_s`` passes."""


class StreamBridge(ABC):
    """Per-run event streams: bounded retention, TTL cleanup, resumable subscriptions."""

    cross_process: ClassVar[bool]
    """Whether a subscriber in another process sees this process's publishes."""

    faults: ClassVar[tuple[type[BaseException], ...]] = (BridgeFault,)
    """Exceptions that mean "the backend failed", never "the caller is wrong"."""

    def __init__(
        self, *, retention: int, ttl_s: float, heartbeat_s: float, max_subscribers: int | None = None,
        end_grace_s: float | None = None,
    ) -> None:
        if retention < 1:
            raise ValueError("retention must be at least 1")
        if ttl_s <= 0 or heartbeat_s <= 0:
            raise ValueError("ttl_s and heartbeat_s must be positive")
        if end_grace_s is not None and end_grace_s <= 0:
            raise ValueError("end_grace_s must be positive")
        if max_subscribers is not None and max_subscribers < 1:
            raise ValueError("max_subscribers must be at least 1")
        self.retention = retention
        self.ttl_s = ttl_s
        self.end_grace_s = ttl_s if end_grace_s is None else min(end_grace_s, ttl_s)
        """How long a stream is kept after its END; later joins are answered from the record."""
        self.heartbeat_s = heartbeat_s
        self.max_subscribers = max_subscribers
        self.subscribers = 0
        """Subscriptions of this process being iterated now."""
        self.publish_failures = 0
        """Publishes (END included) lost to backend faults since this bridge was opened."""
        self.closed = False
        """Set by ``close``: subscriptions then end with ``StreamGone`` (no stream will resume)."""
        self._last: dict[str, int] = {}  # run -> last seq this process published or skipped
        self._faulted_until = 0.0
        self._backoff_s = FAULT_BACKOFF_S

    # -- publishing ------------------------------------------------------------------------------
    def seed(self, run_id: str, floor: int) -> None:
        """Continue ``run_id``'s numbering after ``floor`` at the latest (a run taken over from
        another process: ``floor`` is the previous owner's ``last_seq``). Never lowers it."""
        if floor < 0:
            raise ValueError("floor must be >= 0")
        self._last[run_id] = max(self._last.get(run_id, 0), floor)

    def last_seq(self, run_id: str) -> int | None:
        """The last seq this process published (or skipped) for ``run_id``; ``None`` before its
        first publish here and after its END."""
        return self._last.get(run_id)

    async def publish(
        self, run_id: str, event: str, data: Any, *, coordinate: dict[str, Any] | None = None
    ) -> StreamEvent | None:
        """Append a data event with the run's next seq (``data`` encoded by ``encode_data``),
        stamped with the run ``coordinate`` if given.

        Returns ``None`` when a backend fault lost it (logged, counted, its seq skipped). Raises
        ``StreamClosed`` after END and ``ValueError`` for a reserved name: those are caller bugs.
        """
        return await self.publish_encoded(run_id, event, encode_data(data), coordinate=coordinate)

    async def publish_encoded(
        self, run_id: str, event: str, payload: bytes, *, coordinate: dict[str, Any] | None = None
    ) -> StreamEvent | None:
        """``publish`` for data already encoded to JSON bytes (the worker's ``EventEncoder``):
        these bytes are what the bridge keeps and every subscriber's SSE frame carries."""
        if not event or event in RESERVED_EVENTS:
            raise ValueError(f"event name {event!r} is empty or reserved")
        payload = redact_bytes(payload)  # no secret of the server's reaches an observer
        floor = self._last.get(run_id, 0)
        if self._faulted():
            self._skip(run_id, floor)
            return None
        try:
            at = encode_data(coordinate) if coordinate is not None else b""
            item = await self._append(run_id, event, payload, floor, at)
        except self.faults as exc:
            self._fault(run_id, f"publishing {event!r}", exc)
            self._skip(run_id, floor)
            return None
        self._last[run_id] = max(self._last.get(run_id, 0), item.seq)
        self._backoff_s = FAULT_BACKOFF_S
        return item

    async def publish_end(self, run_id: str) -> bool:
        """Close the stream. Idempotent. END is kept apart from retention and never trimmed.

        Returns ``False`` when a backend fault lost END (logged and counted); subscribers then
        end from the durable run record. Either way this process forgets the run's counter.
        """
        floor = self._last.pop(run_id, 0)
        if self._faulted():
            return False
        try:
            await self._append_end(run_id, floor)
        except self.faults as exc:
            self._fault(run_id, "publishing END", exc)
            return False
        self._backoff_s = FAULT_BACKOFF_S
        return True

    def _faulted(self) -> bool:
        if time.monotonic() < self._faulted_until:
            self.publish_failures += 1
            return True
        return False

    def _fault(self, run_id: str, what: str, exc: BaseException) -> None:
        self.publish_failures += 1
        self._faulted_until = time.monotonic() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, MAX_FAULT_BACKOFF_S)
        log.warning("run %s: %s failed (%s: %s); the stream will show a gap", run_id, what,
                    type(exc).__name__, exc)

    def _skip(self, run_id: str, floor: int) -> None:
        # Ambiguous faults (a lost reply) may have stored the event: skipping its seq either way
        # means a retry or the next event can never reuse it.
        self._last[run_id] = max(self._last.get(run_id, 0), floor + 1)

    @abstractmethod
    async def _append(self, run_id: str, event: str, payload: bytes, floor: int, at: bytes = b"") -> StreamEvent:
        """Atomically store the event (and its coordinate ``at``) as seq ``max(head, floor) + 1``,
        trim to retention, refresh the TTL; raise ``StreamClosed`` after END."""

    @abstractmethod
    async def _append_end(self, run_id: str, floor: int) -> None:
        """Store END after seq ``max(head, floor)`` unless it is there already."""

    # -- subscribing -----------------------------------------------------------------------------
    def check_capacity(self) -> None:
        """Raise ``TooManySubscribers`` if one more subscription would exceed the limit.

        ``subscribe`` checks it too; the gateway calls it before a response starts, so the
        refused client gets a status code rather than an error event."""
        if self.max_subscribers is not None and self.subscribers >= self.max_subscribers:
            raise TooManySubscribers(
                f"this process already serves {self.subscribers} stream subscribers "
                f"(limits.stream_max_subscribers = {self.max_subscribers}); retry later"
            )

    def subscribe(
        self, run_id: str, *, last_event_id: str | None = None, heartbeat_s: float | None = None
    ) -> AsyncGenerator[StreamEvent, None]:
        """Follow a run: retained events after ``last_event_id``, then live ones, then END.

        ``last_event_id`` and the subscriber limit are checked here, before iteration, so a bad
        header or a full process fails the request up front. :data:`LIVE` means events published
        after iteration starts; a cursor beyond the stream's last event ends the subscription with
        a ``cursor_ahead`` error item. Subscribing never creates a stream: on one that does not
        exist yet the iterator heart-beats until something is published, so callers that must not
        wait on finished-and-reaped runs check ``exists`` and the durable record first. Close the
        iterator (``contextlib.aclosing``) when abandoning it early.
        """
        after = parse_event_id(last_event_id)
        wait_s = self.heartbeat_s if heartbeat_s is None else heartbeat_s
        if wait_s <= 0:
            raise ValueError("heartbeat_s must be positive")
        self.check_capacity()
        return self._follow(run_id, after, wait_s)

    async def _follow(
        self, run_id: str, after: int | None, wait_s: float
    ) -> AsyncGenerator[StreamEvent, None]:
        self.check_capacity()  # the limit may have filled since ``subscribe``
        self.subscribers += 1
        try:
            async with self._reader(run_id) as reader:
                head = await reader.head()
                if after is not None and head is not None and after > head:
                    yield _marker(CURSOR_AHEAD_EVENT, head, {
                        "error": "LastEventIdAhead",
                        "message": f"Last-Event-ID {after} is beyond this run's last event {head}",
                        "last_event_id": after, "head": head,
                    })
                    return
                cursor = (head or 0) if after is None else after
                while True:
                    if self.closed:
                        raise StreamGone("the stream bridge was closed")
                    batch = await reader.read(cursor, wait_s)
                    for item in batch.events:
                        if item.seq > cursor + 1:  # trimmed, or lost to a backend fault
                            yield _gap(cursor, item.seq)
                        cursor = item.seq
                        yield item
                    if batch.ended:
                        if batch.end_seq > cursor:  # the last events were lost, not published
                            yield _gap(cursor, batch.end_seq + 1)
                            cursor = batch.end_seq
                        yield _marker(END_EVENT, cursor)
                        return
                    if not batch.events:
                        yield _marker(HEARTBEAT_EVENT, cursor)
        finally:
            self.subscribers -= 1

    @abstractmethod
    def _reader(self, run_id: str) -> AbstractAsyncContextManager[Reader]:
        """A reader for one subscription, held for the subscription's lifetime."""

    @abstractmethod
    async def retained_bytes(self, run_id: str) -> int:
        """What ``stream_run_max_bytes`` bounds: the run's retained events' ``entry_size`` sum."""

    async def final_seq(self, run_id: str) -> int | None:
        """The last seq of a stream that ended and was dropped, if this bridge still knows it
        (so an observer answered from the record can say exactly how many events it missed)."""
        return None

    # -- thread wake-ups -------------------------------------------------------------------------
    @abstractmethod
    def watch_thread(self, thread_id: str) -> AbstractAsyncContextManager[ThreadWatch]:
        """Wake-ups for new runs of ``thread_id``: every ``announce`` made after the watch opened
        wakes its next ``wait`` (or the current one), so a waiter that checks the store *after*
        opening the watch cannot miss a run admitted meanwhile."""

    async def announce(self, thread_id: str) -> None:
        """Tell the thread's watchers that a run was admitted. Never raises: a lost wake-up only
        costs latency (watchers also re-check on a slow timer)."""
        try:
            await self._announce(thread_id)
        except self.faults as exc:
            log.warning("thread %s: announcing a new run failed (%s: %s)", thread_id, type(exc).__name__, exc)

    @abstractmethod
    async def _announce(self, thread_id: str) -> None:
        """The backend's part of ``announce``."""

    @abstractmethod
    async def exists(self, run_id: str) -> bool:
        """Whether the run's stream holds anything (events or END) and has not expired."""

    @abstractmethod
    async def delete(self, run_id: str) -> None:
        """Remove the stream now; its subscribers get ``StreamGone``."""

    async def close(self) -> None:
        """Release resources (memory: drop every stream). Bounded in time."""
        self.closed = True
        await self._close()

    @abstractmethod
    async def _close(self) -> None:
        """The backend's part of ``close``."""
