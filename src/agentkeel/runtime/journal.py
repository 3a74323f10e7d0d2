"""The run journal: one ordered, durable record of what a run did, written by one writer.

Every record gets a run-wide ``seq`` (strictly increasing from 1) at the moment it is recorded, so
the journal is the run's causal clock: stop reasons, file changes and tool calls all point at seqs.

Why buffered and best-effort: records come from LangChain callbacks (possibly on worker threads) and
must never slow down or break the run. ``record`` is synchronous and never raises; writes happen in
batches on the run's event loop. A store failure keeps the events buffered for the next flush
(re-appending a ``(run_id, seq)`` is a no-op, so a partially applied batch is safe to retry); the
buffer is bounded, and dropped events are counted and reported by a ``journal.dropped`` record
instead of vanishing silently. Unlike DeerFlow's per-thread ``max(seq)+1`` store counter, the seq is
assigned here and is per run; a journal re-opened for a recovered run continues after the last
stored seq instead of colliding with it.

Kinds (``data`` fields; ``caller`` is ``lead`` | ``subagent:<type>`` | ``middleware:<name>``):

=================  =============================================================================
kind               data
=================  =============================================================================
run.start          whatever the worker knows at start (assistant, model, attempt, ...)
run.status         {status, ...} on every status change
run.end            {status, stop_reason, usage, ...}
model.call         {model, input_tokens, output_tokens, latency_ms, finish_reason, tool_calls: n}
model.error        {model, error_type, message, latency_ms}
tool.call          {name, call_id, status (ok|error|interrupted), duration_ms, result_size
                   [, error_type]}
intervention       {middleware, action, detail} (guards)
stop_reason        the stop-reason entry dict (recorded at the entry's own ``seq``)
file.changed       {path, change (added|modified|deleted), before_sha256, after_sha256,
                   tool_call_id, tool_name, tool_seq}
chain.manifest     the middleware chain the run executed
error              {type, message}
journal.dropped    {count} events lost because the store stayed unreachable and the buffer filled
=================  =============================================================================
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from agentkeel.runtime.records import utcnow
from agentkeel.runtime.stores.base import JournalEvent, JournalStore

log = logging.getLogger(__name__)

# Largest single ``append``: after an outage the buffer may hold thousands of events, and one huge
# statement is both slow and more likely to fail as a whole.
_MAX_BATCH = 500


class Journal:
    """Buffered, ordered writer of one run's journal. Create with :meth:`open`."""

    def __init__(
        self,
        store: JournalStore,
        run_id: str,
        thread_id: str,
        *,
        loop: asyncio.AbstractEventLoop,
        flush_every: int = 32,
        max_buffer: int = 10_000,
        last_seq: int = 0,
    ) -> None:
        if flush_every < 1 or max_buffer < flush_every:
            raise ValueError("need 1 <= flush_every <= max_buffer")
        self._store = store
        self.run_id = run_id
        self.thread_id = thread_id
        self._loop = loop
        self._flush_every = flush_every
        self._max_buffer = max_buffer
        self._lock = threading.Lock()  # seq, buffer and counters; callbacks may run in threads
        self._seq = last_seq
        self._buffer: list[JournalEvent] = []
        self._tool_seqs: dict[str, int] = {}
        self._recorded = 0
        self._dropped = 0
        self._unreported_drops = 0
        # Background flushes start when the buffer reaches this size. After a failed flush it moves
        # up by ``flush_every`` so a down store is retried every ``flush_every`` records, not on
        # every record.
        self._trigger_at = flush_every
        self._flush_pending = False
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()  # one append in flight, in seq order
        self._fenced = False

    @classmethod
    async def open(
        cls,
        store: JournalStore,
        run_id: str,
        thread_id: str,
        *,
        flush_every: int = 32,
        max_buffer: int = 10_000,
    ) -> Journal:
        """Open the run's journal; raises if the store cannot be read (a run error, not a warning).

        If the run already has events (a recovered run's next attempt), seqs continue after them.
        """
        first = await store.list(run_id, limit=1)
        last_seq = await _last_stored_seq(store, run_id, first[0].seq) if first else 0
        if last_seq:
            log.info("journal %s: continuing after stored seq %d", run_id, last_seq)
        return cls(
            store,
            run_id,
            thread_id,
            loop=asyncio.get_running_loop(),
            flush_every=flush_every,
            max_buffer=max_buffer,
            last_seq=last_seq,
        )

    # -- recording ---------------------------------------------------------------------------
    def next_seq(self) -> int:
        """Reserve the next seq (for a record written later with ``record(..., seq=...)``)."""
        with self._lock:
            self._seq += 1
            return self._seq

    def record(
        self,
        kind: str,
        data: dict[str, Any] | None = None,
        caller: str | None = None,
        *,
        seq: int | None = None,
    ) -> int:
        """Buffer one event and return its seq. Never raises.

        ``seq`` is for a seq reserved earlier with :meth:`next_seq` (a stop reason is journaled at
        the seq it was stamped with); by default a new one is assigned.
        """
        schedule = False
        with self._lock:
            if self._fenced:
                return seq if seq is not None else self._seq
            if seq is None:
                self._seq += 1
                seq = self._seq
            try:
                event = JournalEvent(
                    run_id=self.run_id,
                    thread_id=self.thread_id,
                    seq=seq,
                    kind=kind,
                    data=_json_safe(data),
                    caller=caller,
                    ts=utcnow(),
                )
            except Exception:  # data that is not a mapping; the run must not notice
                log.exception("journal %s: could not record %s event", self.run_id, kind)
                return seq
            self._buffer.append(event)
            self._recorded += 1
            if kind == "tool.call" and event.data.get("call_id"):
                self._tool_seqs[str(event.data["call_id"])] = seq
            dropped = self._trim_locked()
            if len(self._buffer) >= self._trigger_at and not self._flush_pending:
                self._flush_pending = schedule = True
        self._warn_dropped(dropped)
        if schedule:
            self._schedule_flush()
        return seq

    def seq_of_tool_call(self, call_id: str) -> int | None:
        """The seq of the ``tool.call`` record of tool call ``call_id``, if one was recorded."""
        with self._lock:
            return self._tool_seqs.get(call_id)

    @property
    def events_recorded(self) -> int:
        return self._recorded

    @property
    def dropped(self) -> int:
        """Events lost to the buffer bound (the store was unreachable for too long)."""
        return self._dropped

    @property
    def pending(self) -> int:
        """Events recorded but not yet written."""
        with self._lock:
            return len(self._buffer)

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    # -- writing -----------------------------------------------------------------------------
    async def flush(self) -> bool:
        """Write every buffered event in seq order; False (events kept) if the store failed."""
        async with self._write_lock:
            with self._lock:
                batch, self._buffer = self._buffer, []
            batch.sort(key=lambda e: e.seq)
            for start in range(0, len(batch), _MAX_BATCH):
                try:
                    await self._store.append(batch[start : start + _MAX_BATCH])
                except BaseException as exc:
                    self._rebuffer(batch[start:])
                    if not isinstance(exc, Exception):  # cancellation: keep events, propagate
                        raise
                    log.warning(
                        "journal %s: writing %d events failed, kept for the next flush: %r",
                        self.run_id,
                        len(batch) - start,
                        exc,
                    )
                    return False
            with self._lock:
                self._trigger_at = self._flush_every
                report, self._unreported_drops = self._unreported_drops, 0
        if report:
            self.record("journal.dropped", {"count": report})
        return True

    async def close(self) -> None:
        """Wait for a background flush, write what is left. Never raises (cancellation aside)."""
        try:
            task = self._task
            if task is not None and not task.done():
                await asyncio.wait([task])
            # A second pass writes the ``journal.dropped`` note a successful first pass may add.
            for _ in range(2):
                if not self.pending or not await self.flush():
                    break
            if self.pending:
                log.error("journal %s: closed with %d unwritten events", self.run_id, self.pending)
        except Exception:
            log.exception("journal %s: close failed", self.run_id)

    def fence(self) -> None:
        """Drop what is buffered and write nothing more: this attempt lost the run, and a newer
        attempt's journal continues from the stored seqs (re-using a seq here would shadow it)."""
        with self._lock:
            self._fenced = True
            self._buffer.clear()

    # -- internals ---------------------------------------------------------------------------
    def _trim_locked(self) -> int:
        excess = len(self._buffer) - self._max_buffer
        if excess <= 0:
            return 0
        del self._buffer[:excess]
        self._dropped += excess
        self._unreported_drops += excess
        return excess

    def _rebuffer(self, events: list[JournalEvent]) -> None:
        with self._lock:
            self._buffer[:0] = events
            dropped = self._trim_locked()
            self._trigger_at = len(self._buffer) + self._flush_every
        self._warn_dropped(dropped)

    def _warn_dropped(self, count: int) -> None:
        if count:
            log.warning("journal %s: buffer full, dropped %d oldest events", self.run_id, count)

    def _schedule_flush(self) -> None:
        """Start a background flush on the run's loop, from the loop's thread or any other."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is self._loop:
                self._start_flush_task()
            else:
                self._loop.call_soon_threadsafe(self._start_flush_task)
        except RuntimeError:  # the loop is closed: events stay buffered for close()/flush()
            with self._lock:
                self._flush_pending = False

    def _start_flush_task(self) -> None:
        self._task = self._loop.create_task(self._background_flush())

    async def _background_flush(self) -> None:
        try:
            await self.flush()
        except Exception:
            log.exception("journal %s: background flush failed", self.run_id)
        finally:
            with self._lock:
                self._flush_pending = False


def _json_safe(data: dict[str, Any] | None) -> dict[str, Any]:
    """A deep, JSON-clean copy: one unserialisable value must not make its whole batch unwritable
    forever (the store would refuse every retry), and later mutation by the caller must not leak in.
    Values JSON cannot represent are stored as their ``str``."""
    return dict(json.loads(json.dumps(dict(data or {}), default=str)))


async def _last_stored_seq(store: JournalStore, run_id: str, known: int) -> int:
    """Highest stored seq of the run in O(log n) ``list(limit=1)`` probes (gallop, then bisect)."""
    low, step = known, 64  # an event with seq ``low`` exists
    while events := await store.list(run_id, after_seq=low + step, limit=1):
        low, step = events[0].seq, step * 2
    high = low + step  # no event has a seq above ``high``
    while low < high:
        mid = (low + high) // 2
        events = await store.list(run_id, after_seq=mid, limit=1)
        if events:
            low = events[0].seq
        else:
            high = mid
    return low
