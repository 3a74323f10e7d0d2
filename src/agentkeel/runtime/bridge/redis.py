"""Redis Streams bridge: one stream key per run, shared by every process of a deployment.

Layout: ``{prefix}:stream:{run_id}`` is a Redis stream whose data entries have the explicit id
``<seq>-0`` and fields ``event``, ``data`` (JSON), ``at`` (the run coordinate, JSON or "") and
``b`` (the bytes of the stream up to and including this entry, see below); END is the entry
``<last seq>-1`` (field ``end``). Keeping everything in the one key means there is no second key to expire, delete or
keep consistent, and the stream itself answers "what is the last seq and has it ended": its newest
entry, which exact ``MAXLEN`` trimming never removes.

Appends run as one Lua script (read the newest entry, refuse if it is END, ``XADD`` the next seq
with exact ``MAXLEN``, refresh ``PEXPIRE``), so concurrent publishers in any number of processes
get unique, contiguous seqs.

Streams are bounded in bytes as well as in events (``run_max_bytes``, the same
``stream_run_max_bytes`` as the memory bridge, counted the same way by ``entry_size``). Each entry
carries ``b``, its stream's running byte total, so the script knows the retained bytes from the
newest entry and where each old one starts without any second key; when the total is over the
budget it reads the oldest entries a few at a time until the first that may stay and ``XTRIM``s by
``MINID`` to it. Every entry is read at most once before it is trimmed, so this costs an append
O(1) amortised; the newest event always stays, and a subscriber that had not read what went gets
a ``gap``, exactly as with count trimming. END is added with ``MAXLEN retention + 1`` so it never costs an
event. Every write refreshes the TTL, so a stream expires ``ttl_s`` after its last publish if
abandoned, and ``end_grace_s`` after its END. No second key outlives it, so an observer answered
from the record after that learns that it missed events (a ``gap``), not how many.
Event data is stored as the JSON bytes the publisher encoded and handed back as such.

Thread wake-ups (``announce``) are entries of ``{prefix}:thread:{thread_id}``, a stream capped at
one entry with the stream TTL; a watcher ``XREAD BLOCK``s after the newest id it saw, so an
announcement made between two of its reads is not missed.

The append takes the publisher's floor (its last seq, see ``StreamBridge``): the seq is
``max(newest entry, floor) + 1``, so a key that vanished (deleted, expired, lost in a restart of a
Redis without persistence) continues the numbering instead of restarting it at 1.

Publishers and subscribers use separate clients and pools: an idle subscriber holds a connection
in ``XREAD BLOCK`` for a heartbeat at a time, and a pool full of them must never block a publish.
Both clients have socket and connect timeouts, health checks and keepalive, and no automatic
retries, so nothing waits on an unreachable or half-open server for long.

Subscribers ``XREAD BLOCK`` for one heartbeat interval at a time. Reads are idempotent, so
transient connection errors are retried a few times with backoff; a read that still fails (or
outlasts its heartbeat) counts as a heartbeat, so a subscriber outlives a Redis restart and its
observer can check the run record meanwhile. Publishes are not retried (a lost reply could mean
the event was stored, and a retry would publish it twice).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentkeel.runtime.bridge.base import (
    EVENT_OVERHEAD,
    READ_BATCH,
    Batch,
    BridgeFault,
    Reader,
    StreamBridge,
    StreamClosed,
    StreamEvent,
    StreamGone,
    ThreadWatch,
    data_event,
    entry_size,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
PUBLISH_TIMEOUT_S = 2.0
"""Socket timeout of publishes: how long a run may wait on one publish to a hung server."""
READ_GRACE_S = 2.0
"""How much longer than its ``BLOCK`` a subscriber's read may take before it is abandoned."""
HEAD_TIMEOUT_S = 3.0
"""Bound on a subscription's first read (with its retries), so a hung server fails it quickly."""
HEALTH_CHECK_S = 15
CLOSE_TIMEOUT_S = 2.0
POOL_MARGIN = 16
"""Subscriber connections beyond ``max_subscribers`` (``exists`` checks, draining readers)."""

_CLOSED = "AGENTKEEL_STREAM_CLOSED"
TRIM_SCAN = 4
"""Oldest entries the append script reads at a time while looking for where byte trimming stops."""
# ARGV: retention, ttl ms, kind, floor, then for an event: name, data, coordinate, run max bytes
# (0: unbounded), per-entry overhead; for END: the grace in ms.
_APPEND = f"""
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end
local function size_of(fields)
  local n = tonumber(ARGV[9])
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == 'event' or name == 'data' or name == 'at' then n = n + string.len(fields[i + 1]) end
  end
  return n
end
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local seq = 0
local upto = 0
if top[1] then
  local id = top[1][1]
  local dash = string.find(id, '-', 1, true)
  seq = tonumber(string.sub(id, 1, dash - 1))
  if string.sub(id, dash + 1) ~= '0' then
    if ARGV[3] == 'end' then return seq end
    return redis.error_reply('{_CLOSED} stream has ended')
  end
  upto = tonumber(field(top[1][2], 'b')) or 0
end
seq = math.max(seq, tonumber(ARGV[4]))
if ARGV[3] == 'end' then
  redis.call('XADD', KEYS[1], 'MAXLEN', tonumber(ARGV[1]) + 1, seq .. '-1', 'end', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return seq
end
seq = seq + 1
local newest = seq .. '-0'
upto = upto + string.len(ARGV[5]) + string.len(ARGV[6]) + string.len(ARGV[7]) + tonumber(ARGV[9])
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], newest, 'event', ARGV[5], 'data', ARGV[6], 'at', ARGV[7], 'b', upto)
local max = tonumber(ARGV[8])
if max > 0 and upto > max then
  -- Keep the oldest entry that starts at or after upto - max (or the newest): drop all before it.
  local keep = nil
  local start = '-'
  while not keep do
    local batch = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', {TRIM_SCAN})
    if not batch[1] then break end
    for _, entry in ipairs(batch) do
      local starts = (tonumber(field(entry[2], 'b')) or 0) - size_of(entry[2])
      if entry[1] == newest or starts >= upto - max then
        keep = entry[1]
        break
      end
      start = '(' .. entry[1]
    end
  end
  if keep then redis.call('XTRIM', KEYS[1], 'MINID', keep) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return seq
"""

READ_RETRIES = 3
_BACKOFF_S = 0.05
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)


def open_clients(url: str, *, heartbeat_s: float, max_subscribers: int | None) -> tuple[Redis, Redis]:
    """(publisher, subscriber) clients of ``url``, with separate pools and bounded waits."""
    common: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_S,
        "socket_keepalive": True,
        "retry": Retry(NoBackoff(), 0),  # publishes must not repeat; reads retry in _retrying
    }
    publisher = Redis.from_url(url, socket_timeout=PUBLISH_TIMEOUT_S, decode_responses=True, **common)
    subscriber = Redis.from_url(  # raw replies: event data is handed on as the bytes stored
        url,
        decode_responses=False,
        socket_timeout=heartbeat_s + READ_GRACE_S,
        max_connections=None if max_subscribers is None else max_subscribers + POOL_MARGIN,
        **common,
    )
    return publisher, subscriber


def _split_id(entry_id: str | bytes) -> tuple[int, bool]:
    """(seq, is_end) of one of our stream entry ids (from a decoding client or a raw one)."""
    seq, sub = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")
    return int(seq), sub != "0"


def _field(fields: dict[Any, Any], name: str) -> Any:
    """A field of an entry read by a raw client (bytes keys) or a decoding one (str keys)."""
    return fields[name.encode()] if name.encode() in fields else fields[name]


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _offset(fields: dict[Any, Any]) -> int:
    """An entry's ``b``: the bytes of its stream up to and including it (0 if written without)."""
    value = fields.get(b"b", fields.get("b"))
    return 0 if value is None else int(value)


async def _retrying(op: Callable[[], Awaitable[T]]) -> T:
    """Run an idempotent read, retrying transient errors with doubling backoff, then re-raise."""
    for attempt in range(READ_RETRIES):
        try:
            return await op()
        except _TRANSIENT:
            await asyncio.sleep(_BACKOFF_S * 2**attempt)
    return await op()


class _RedisReader(Reader):
    def __init__(self, client: Redis, key: str) -> None:
        self._client = client
        self._key = key
        # Only a stream this reader has seen can "disappear"; before that, absence means
        # "not published yet".
        self._seen = False

    async def head(self) -> int | None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                top: Any = await _retrying(lambda: self._client.xrevrange(self._key, count=1))
        except (*_TRANSIENT, TimeoutError) as exc:
            raise BridgeFault(f"reading stream {self._key!r}: {exc!r}") from exc
        if not top:
            return None
        self._seen = True
        return _split_id(top[0][0])[0]

    async def read(self, after: int, wait_s: float) -> Batch:
        try:
            async with asyncio.timeout(wait_s + READ_GRACE_S):
                return await self._read(after, wait_s)
        except (*_TRANSIENT, TimeoutError) as exc:
            # Redis is down or hung: report "nothing yet" once the heartbeat is over, so the
            # observer can consult the run record, and try again after that.
            log.debug("reading %s failed: %r", self._key, exc)
            await asyncio.sleep(wait_s)
            return Batch([], False)

    async def _read(self, after: int, wait_s: float) -> Batch:
        block_ms = max(1, round(wait_s * 1000))
        reply: Any = await _retrying(
            lambda: self._client.xread({self._key: f"{after}-0"}, count=READ_BATCH, block=block_ms)
        )
        if not reply:
            if self._seen and not await _retrying(lambda: self._client.exists(self._key)):
                raise StreamGone("the stream was deleted or expired")
            return Batch([], False)
        self._seen = True
        events: list[StreamEvent] = []
        for entry_id, fields in reply[0][1]:
            seq, is_end = _split_id(entry_id)
            if is_end:
                return Batch(events, True, seq)
            event, data = _field(fields, "event"), _field(fields, "data")
            at = fields.get(b"at", fields.get("at", b""))
            events.append(data_event(
                seq, event.decode() if isinstance(event, bytes) else event,
                data.encode() if isinstance(data, str) else data,
                at.encode() if isinstance(at, str) else at,
            ))
        return Batch(events, False)


class _RedisWatch(ThreadWatch):
    def __init__(self, client: Redis, key: str, last: str) -> None:
        self._client = client
        self._key = key
        self._last = last

    async def wait(self, timeout_s: float) -> bool:
        block_ms = max(1, round(timeout_s * 1000))
        try:
            async with asyncio.timeout(timeout_s + READ_GRACE_S):
                reply: Any = await self._client.xread({self._key: self._last}, count=1, block=block_ms)
        except (*_TRANSIENT, TimeoutError) as exc:
            log.debug("watching %s failed: %r", self._key, exc)
            await asyncio.sleep(timeout_s)
            return False
        if not reply:
            return False
        self._last = reply[0][1][-1][0]
        return True


class RedisStreamBridge(StreamBridge):
    """Takes ownership of ``client`` (publishes, ``exists``, ``delete``) and ``subscriber``
    (subscriptions; defaults to ``client``); ``client`` with ``decode_responses=True``, ``subscriber``
    either way (``open_clients`` makes it raw, so event data arrives as the bytes stored);
    ``close`` closes them."""

    cross_process = True
    faults: ClassVar[tuple[type[BaseException], ...]] = (RedisError, OSError, BridgeFault)

    def __init__(
        self,
        client: Redis,
        *,
        subscriber: Redis | None = None,
        prefix: str = "agentkeel",
        retention: int,
        ttl_s: float,
        heartbeat_s: float,
        max_subscribers: int | None = None,
        end_grace_s: float | None = None,
        run_max_bytes: int | None = None,
    ) -> None:
        super().__init__(
            retention=retention, ttl_s=ttl_s, heartbeat_s=heartbeat_s, max_subscribers=max_subscribers,
            end_grace_s=end_grace_s,
        )
        if run_max_bytes is not None and run_max_bytes < 1:
            raise ValueError("run_max_bytes must be positive")
        self.run_max_bytes = run_max_bytes
        self._client = client
        self._subscriber = subscriber or client
        self._prefix = prefix
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._grace_ms = max(1, round(self.end_grace_s * 1000))
        self._script = client.register_script(_APPEND)

    def key(self, run_id: str) -> str:
        return f"{self._prefix}:stream:{run_id}"

    def _thread_key(self, thread_id: str) -> str:
        return f"{self._prefix}:thread:{thread_id}"

    async def _run_script(self, run_id: str, kind: str, floor: int, *args: str | bytes | int) -> int:
        try:
            seq = await self._script(
                keys=[self.key(run_id)],
                args=[self.retention, self._ttl_ms, kind, floor, *args],
            )
        except ResponseError as exc:
            if _CLOSED in str(exc):
                raise StreamClosed(f"stream {run_id!r} has ended") from None
            raise
        return int(seq)

    async def _append(self, run_id: str, event: str, payload: bytes, floor: int, at: bytes = b"") -> StreamEvent:
        seq = await self._run_script(
            run_id, "event", floor, event, payload, at, self.run_max_bytes or 0, EVENT_OVERHEAD
        )
        return data_event(seq, event, payload, at)

    async def _append_end(self, run_id: str, floor: int) -> None:
        await self._run_script(run_id, "end", floor, self._grace_ms)

    @asynccontextmanager
    async def watch_thread(self, thread_id: str) -> AsyncIterator[ThreadWatch]:
        key = self._thread_key(thread_id)
        try:
            top: Any = await _retrying(lambda: self._subscriber.xrevrange(key, count=1))
        except _TRANSIENT as exc:  # from the start, then: at worst one needless wake-up
            log.debug("reading %s failed: %r", key, exc)
            top = None
        yield _RedisWatch(self._subscriber, key, top[0][0] if top else "0-0")

    async def _announce(self, thread_id: str) -> None:
        key = self._thread_key(thread_id)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.xadd(key, {"run": "1"}, maxlen=1, approximate=False)
            pipe.pexpire(key, self._ttl_ms)
            await pipe.execute()

    @asynccontextmanager
    async def _reader(self, run_id: str) -> AsyncIterator[Reader]:
        yield _RedisReader(self._subscriber, self.key(run_id))

    async def exists(self, run_id: str) -> bool:
        return bool(await self._client.exists(self.key(run_id)))

    async def retained_bytes(self, run_id: str) -> int:
        key = self.key(run_id)
        oldest: Any = await self._subscriber.xrange(key, count=1)
        newest: Any = await self._subscriber.xrevrange(key, count=2)  # END may be the newest entry
        data = [(fields, entry_id) for entry_id, fields in newest if not _split_id(entry_id)[1]]
        if not oldest or not data or _split_id(oldest[0][0])[1]:
            return 0
        first = oldest[0][1]
        size = entry_size(*(_raw(_field(first, name)) for name in ("event", "data", "at")))
        return _offset(data[0][0]) - (_offset(first) - size)

    async def delete(self, run_id: str) -> None:
        await self._client.delete(self.key(run_id))

    async def _close(self) -> None:
        for client in dict.fromkeys((self._client, self._subscriber)):
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await client.aclose()
            except (TimeoutError, RedisError, OSError) as exc:
                log.warning("closing a Redis client failed: %r", exc)
