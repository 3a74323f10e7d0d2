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

Why a timer as well as a size trigger: a run of a few dozen events never fills a batch, so a
size-only writer loses the whole run on a crash. A timer on the run's loop writes whatever is
buffered once the oldest buffered event is ``flush_ms`` old, so a crash (``kill -9``, a lost
host) loses at most the last flush interval. After a failed write the timer retries with a
doubling delay (at most ``_MAX_RETRY_DELAY_S``), so a down store is not hammered.

Why ``write_through``: some records must be durable *before* the run goes on — a tool call's
intent is written before the tool runs, so a recovered attempt knows which side effects may already
have happened. ``write_through`` records, writes everything buffered up to and including the event,
and raises :class:`JournalWriteError` if the store failed; the caller decides what that means.

Every event is stamped with the run coordinate: its ``attempt`` and the root graph's ``step`` being
executed (:meth:`Journal.at_step`); checkpoints and stream events carry the same coordinate
(``runtime/timeline.py`` aligns them). A subagent's records name its ``task_id``.

Kinds (``data`` fields; ``caller`` is ``lead`` | ``subagent:<type>`` | ``middleware:<name>``):

=================  =============================================================================
kind               data
=================  =============================================================================
run.start          whatever the worker knows at start (assistant, model, attempt, ...)
run.status         {status, refused, reason}: a completion refused because a stored control
                   request came first (the run then ends as the request says)
run.end            {status, error, usage, attempt, [rolled_back | recovered]}: stored by the run
                   store in the completion's own transaction, never by this writer
run.recovered      {lost_owner, lost_attempt, attempt, owner, policy, lease_expired_at}
model.call         {model, input_tokens, output_tokens, latency_ms, finish_reason, tool_calls: n,
                   estimated, [task_id,] output {text, tool_calls, invalid_tool_calls, provider}}
model.error        {model, error_type, kind, status, message, latency_ms [, task_id]}
tool.intent        {call_id, name, idempotent, attempt}: recorded before the tool runs, and
                   stored before it runs unless the tool is idempotent
                   (``harness.middleware.side_effect_ledger``)
tool.call          {name, call_id, status (ok|error|interrupted), duration_ms, result_size
                   [, result_sha256] [, task_id] [, result_text] [, error_type]}: after the tool
                   ran (``result_text``: a subagent's string result up to 16,000 characters)
intervention       {middleware, action, detail, ...} (guards; ``recovered_call`` when a call
                   lost with an earlier attempt is answered without running it)
stop_reason        the stop-reason entry dict (recorded at the entry's own ``seq``)
file.changed       {path, change (added|modified|deleted), before_sha256, after_sha256,
                   tool_call_id, tool_name, tool_seq}
                   [, agent (lead | subagent:<type>/<task_id>) on the record and each step]
subagent.start     {task_id, subagent_type, description, model, depth, queued_s}; caller
                   ``subagent:<type>``: a child began (``runtime/children.py`` reads both kinds)
subagent.end       {task_id, subagent_type, description, status (completed|failed|cancelled|
                   timed_out), stop_reason, stop_reasons, usage {input_tokens, output_tokens,
                   total_tokens, calls}, model, files_changed, brief (<= 2000 chars), sha256 (of
                   the full result), turns, duration_s, error}; caller ``subagent:<type>``
chain.manifest     the middleware chain the run executed
error              {type, message}
journal.dropped    {count} events lost because the store stayed unreachable and the buffer filled
=================  =============================================================================
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agentkeel.runtime.records import utcnow
from agentkeel.runtime.redaction import redact_json
from agentkeel.runtime.stores.base import JournalEvent, JournalStore

log = logging.getLogger(__name__)

# Largest single ``append``: after an outage the buffer may hold thousands of events, and one huge
# statement is both slow and more likely to fail as a whole.
_MAX_BATCH = 500
# Sees each event as it is recorded, on whichever thread recorded it; must be quick and thread-safe.
Observer = Callable[[JournalEvent], None]
# Longest wait between retries of a store that keeps failing (the delay doubles from ``flush_ms``).
_MAX_RETRY_DELAY_S = 5.0


class JournalWriteError(RuntimeError):
    """A :meth:`Journal.write_through` record could not be stored (the store failed); the record
    stays buffered for a later flush."""


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
        flush_ms: int = 250,
        max_buffer: int = 10_000,
        last_seq: int = 0,
        attempt: int | None = None,
        observer: Observer | None = None,
    ) -> None:
        if flush_every < 1 or max_buffer < flush_every:
            raise ValueError("need 1 <= flush_every <= max_buffer")
        if flush_ms < 1:
            raise ValueError("need flush_ms >= 1")
        self._store = store
        self.run_id = run_id
        self.thread_id = thread_id
        self._loop = loop
        self._flush_every = flush_every
        self._interval = flush_ms / 1000
        self._max_buffer = max_buffer
        self._lock = threading.Lock()  # seq, buffer, counters and timer flags; callbacks may run in threads
        self._seq = last_seq
        self._buffer: list[JournalEvent] = []
        self._oldest_at: float | None = None  # time.monotonic() of the oldest buffered event
        self._tool_seqs: dict[str, int] = {}
        self._recorded = 0
        self._dropped = 0
        self._unreported_drops = 0
        # Background flushes start when the buffer reaches this size. After a failed flush it moves
        # up by ``flush_every`` so a down store is retried every ``flush_every`` records, not on
        # every record.
        self._trigger_at = flush_every
        self._flush_pending = False
        # The age timer: armed while events are buffered; after failures it waits until ``_retry_at``.
        self._timer_armed = False
        self._timer: asyncio.TimerHandle | None = None  # touched on the loop only
        self._failures = 0
        self._retry_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()  # one append in flight, in seq order
        self._fenced = False
        self.attempt = attempt  # the coordinate's attempt and step (see :meth:`coordinate`)
        self._step: int | None = None
        self._step_floor: dict[int, int] = {}  # step -> the last seq recorded before it began
        self._observer = observer

    @classmethod
    async def open(
        cls,
        store: JournalStore,
        run_id: str,
        thread_id: str,
        *,
        flush_every: int = 32,
        flush_ms: int = 250,
        max_buffer: int = 10_000,
        attempt: int | None = None,
        observer: Observer | None = None,
        empty: bool = False,
    ) -> Journal:
        """Open the run's journal; raises if the store cannot be read (a run error, not a warning).

        ``flush_ms`` is the oldest a buffered event gets before it is written (``limits.journal_flush_ms``):
        the most of the journal a crash can lose. If the run already has events (a recovered run's
        next attempt), seqs continue after them. ``observer`` sees each event as it is recorded
        (the process's run metrics count model calls there, mid-run).

        ``empty``: the caller knows the run has no events yet, so the store is not read. The
        worker says so for a run's first attempt: only the attempt that owns a run journals, a
        run's attempt is bumped whenever another one takes it over, and opening the journal is
        the first attempt's first act, so nothing can precede it.
        """
        first = [] if empty else await store.list(run_id, limit=1)
        last_seq = await _last_stored_seq(store, run_id, first[0].seq) if first else 0
        if last_seq:
            log.info("journal %s: continuing after stored seq %d", run_id, last_seq)
        return cls(
            store,
            run_id,
            thread_id,
            loop=asyncio.get_running_loop(),
            flush_every=flush_every,
            flush_ms=flush_ms,
            max_buffer=max_buffer,
            last_seq=last_seq,
            attempt=attempt,
            observer=observer,
        )

    # -- the coordinate ------------------------------------------------------------------------
    def at_step(self, step: int) -> None:
        """The root graph began superstep ``step``: every event from now on carries it. Called
        when the step's first task starts (``JournalCallbackHandler.on_chain_start``), so it is
        exact even though LangGraph writes the previous step's checkpoint in the background."""
        with self._lock:
            if self._step is None or step > self._step:
                self._step = step
                self._step_floor.setdefault(step, self._seq)

    def coordinate(self) -> dict[str, Any]:
        """``{run_id, attempt, step, journal_seq}`` now (``journal_seq``: the last seq recorded)."""
        with self._lock:
            return {"run_id": self.run_id, "attempt": self.attempt, "step": self._step, "journal_seq": self._seq}

    def seq_through_step(self, step: int) -> int:
        """The last seq recorded before step ``step + 1`` began: what a checkpoint of ``step`` covers."""
        with self._lock:
            return self._step_floor.get(step + 1, self._seq)

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
        try:
            return self._buffer_event(kind, data, caller, seq)
        except _Unrecordable as exc:  # data that is not a mapping; the run must not notice
            log.error("journal %s: could not record %s event", self.run_id, kind, exc_info=exc.__cause__)
            return exc.seq

    async def write_through(
        self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None
    ) -> int:
        """Record one event and return its seq once it, and everything recorded before it, is stored.

        Raises :class:`JournalWriteError` when the store fails (the events stay buffered and are
        written by a later flush) or the journal is fenced, and ``TypeError`` for data that cannot
        be recorded.
        """
        try:
            seq = self._buffer_event(kind, data, caller, None)
        except _Unrecordable as exc:
            raise TypeError(f"journal {self.run_id}: cannot record {kind}: {exc.__cause__}") from None
        # Whatever was recorded earlier is buffered, or taken by a flush that holds the write lock
        # (and put back if it failed), so one write under the lock covers it all.
        async with self._write_lock:
            error = await self._write_buffered()
        if error is not None:
            raise JournalWriteError(f"journal {self.run_id}: {kind} seq {seq} not stored: {error!r}") from error
        self._report_drops()
        return seq

    def unbuffered(self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None,
                   *, seq: int | None = None) -> JournalEvent:
        """An event with a seq of this journal (a new one, or ``seq``) that this writer will not
        write: the caller stores it itself — the run's ``run.end`` goes into the completion's own
        transaction (``RunStore.finish``), so the journal ends exactly when the record does."""
        with self._lock:
            return self._event_locked(kind, data, caller, seq)

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
            error = await self._write_buffered()
        if error is not None:
            return False
        self._report_drops()
        return True

    async def close(self) -> None:
        """Wait for background flushes, write what is left, stop the timer. Never raises
        (cancellation aside)."""
        try:
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            # A second pass writes the ``journal.dropped`` note a successful first pass may add.
            for _ in range(2):
                if not self.pending or not await self.flush():
                    break
            if self.pending:
                log.error("journal %s: closed with %d unwritten events", self.run_id, self.pending)
        except Exception:
            log.exception("journal %s: close failed", self.run_id)
        finally:
            self._stop_timer()

    def fence(self) -> None:
        """Drop what is buffered and write nothing more: this attempt lost the run, and a newer
        attempt's journal continues from the stored seqs (re-using a seq here would shadow it).
        ``write_through`` raises from now on."""
        with self._lock:
            self._fenced = True
            self._buffer.clear()
            self._oldest_at = None

    # -- internals ---------------------------------------------------------------------------
    def _event_locked(self, kind: str, data: dict[str, Any] | None, caller: str | None, seq: int | None) -> JournalEvent:
        """One event of this journal at ``seq`` (a new one if None); call with the lock held."""
        if seq is None:
            self._seq += 1
            seq = self._seq
        return JournalEvent(self.run_id, self.thread_id, seq, kind, _json_safe(data), caller, utcnow(),
                            attempt=self.attempt, step=self._step)

    def _buffer_event(self, kind: str, data: dict[str, Any] | None, caller: str | None, seq: int | None) -> int:
        """Append one event (under the lock) and start whatever write it makes due."""
        flush = arm = False
        with self._lock:
            if self._fenced:
                return seq if seq is not None else self._seq
            if seq is None:
                self._seq += 1
                seq = self._seq
            try:
                event = self._event_locked(kind, data, caller, seq)
            except Exception as exc:
                raise _Unrecordable(seq) from exc
            self._buffer.append(event)
            if self._oldest_at is None:
                self._oldest_at = time.monotonic()
            self._recorded += 1
            if kind == "tool.call" and event.data.get("call_id"):
                self._tool_seqs[str(event.data["call_id"])] = seq
            dropped = self._trim_locked()
            if len(self._buffer) >= self._trigger_at and not self._flush_pending:
                self._flush_pending = flush = True
            if not self._timer_armed:
                self._timer_armed = arm = True
        self._warn_dropped(dropped)
        self._observe(event)
        if flush and not self._on_loop(self._start_flush_task):
            with self._lock:
                self._flush_pending = False
        if arm and not self._on_loop(self._check_due):
            with self._lock:
                self._timer_armed = False
        return seq

    async def _write_buffered(self) -> Exception | None:
        """Write the whole buffer in seq order (the caller holds the write lock). On a store
        failure the unwritten events go back to the buffer and the error is returned."""
        with self._lock:
            if self._fenced:
                return self._fenced_error()
            batch, self._buffer = self._buffer, []
            oldest, self._oldest_at = self._oldest_at, None
        batch.sort(key=lambda e: e.seq)
        try:
            for start in range(0, len(batch), _MAX_BATCH):
                try:
                    await self._store.append(batch[start : start + _MAX_BATCH])
                except BaseException as exc:
                    self._rebuffer(batch[start:], oldest)
                    if not isinstance(exc, Exception):  # cancellation: keep events, propagate
                        raise
                    log.warning(
                        "journal %s: writing %d events failed, kept for the next flush: %r",
                        self.run_id,
                        len(batch) - start,
                        exc,
                    )
                    return exc
            with self._lock:
                self._trigger_at = self._flush_every
                self._failures, self._retry_at = 0, 0.0
                # Fenced while writing: what was written stands, but no caller may go on as if
                # its record were the run's (a tool must not run for an attempt that lost the run).
                return self._fenced_error() if self._fenced else None
        finally:
            self._rearm()

    def _fenced_error(self) -> JournalWriteError:
        return JournalWriteError(f"journal {self.run_id}: fenced, this attempt lost the run")

    def _report_drops(self) -> None:
        with self._lock:
            report, self._unreported_drops = self._unreported_drops, 0
        if report:
            self.record("journal.dropped", {"count": report})

    def _trim_locked(self) -> int:
        excess = len(self._buffer) - self._max_buffer
        if excess <= 0:
            return 0
        del self._buffer[:excess]
        self._dropped += excess
        self._unreported_drops += excess
        return excess

    def _rebuffer(self, events: list[JournalEvent], oldest: float | None) -> None:
        with self._lock:
            self._buffer[:0] = events
            self._oldest_at = oldest if oldest is not None else self._oldest_at
            dropped = self._trim_locked()
            self._trigger_at = len(self._buffer) + self._flush_every
            self._failures += 1
            delay = min(self._interval * 2**self._failures, _MAX_RETRY_DELAY_S)
            self._retry_at = time.monotonic() + delay
        self._warn_dropped(dropped)

    def _observe(self, event: JournalEvent) -> None:
        """Hand the event to the observer; whatever it does, the run must not notice."""
        if self._observer is None:
            return
        try:
            self._observer(event)
        except Exception:
            log.exception("journal %s: the observer failed on a %s event", self.run_id, event.kind)

    def _warn_dropped(self, count: int) -> None:
        if count:
            log.warning("journal %s: buffer full, dropped %d oldest events", self.run_id, count)

    def _on_loop(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the run's loop, from the loop's thread or any other; False if the
        loop is closed (events then stay buffered for ``close``/``flush``)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is self._loop:
                callback()
            else:
                self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            return False
        return True

    def _check_due(self) -> None:
        """The age timer (on the loop): flush once the oldest buffered event is ``flush_ms`` old,
        or after the retry delay of a failed write; else wait until then."""
        self._timer = None
        with self._lock:
            if not self._buffer or self._oldest_at is None:
                self._timer_armed = False
                return
            delay = max(self._oldest_at + self._interval, self._retry_at) - time.monotonic()
            if delay <= 0:
                self._timer_armed = False
        if delay > 0:
            self._timer = self._loop.call_later(delay, self._check_due)
        else:
            self._start_flush_task()

    def _rearm(self) -> None:
        """After a write (on the loop): events recorded meanwhile, or put back, need the timer."""
        with self._lock:
            arm = bool(self._buffer) and not self._timer_armed
            if arm:
                self._timer_armed = True
        if arm:
            self._check_due()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            self._timer_armed = False

    def _start_flush_task(self) -> None:
        task = self._loop.create_task(self._background_flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _background_flush(self) -> None:
        try:
            await self.flush()
        except Exception:
            log.exception("journal %s: background flush failed", self.run_id)
        finally:
            with self._lock:
                self._flush_pending = False


class _Unrecordable(Exception):
    def __init__(self, seq: int) -> None:
        super().__init__(seq)
        self.seq = seq


def _json_safe(data: dict[str, Any] | None) -> dict[str, Any]:
    """A deep, JSON-clean copy: one unserialisable value must not make its whole batch unwritable
    forever (the store would refuse every retry), and later mutation by the caller must not leak in.
    Values JSON cannot represent are stored as their ``str``; the server's secrets are redacted
    (:mod:`agentkeel.runtime.redaction`)."""
    return dict(redact_json(dict(data or {})))


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
