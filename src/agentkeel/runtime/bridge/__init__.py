"""Stream bridge: per-run event streams between workers and SSE subscribers.

``open_bridge`` picks the backend from the ``stream`` setting: ``memory`` (one process) or a
``redis://`` / ``rediss://`` / ``unix://`` URL (shared by every process of a deployment).
"""

from __future__ import annotations

from agentkeel.runtime.bridge.base import (
    END_EVENT,
    GAP_EVENT,
    HEARTBEAT_EVENT,
    LIVE,
    EventKind,
    InvalidEventId,
    StreamBridge,
    StreamClosed,
    StreamEvent,
    StreamGone,
    format_event_id,
    parse_event_id,
)
from agentkeel.runtime.bridge.memory import MemoryStreamBridge

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_bridge(
    url: str, *, retention: int, ttl_s: float, heartbeat_s: float, prefix: str = "agentkeel"
) -> StreamBridge:
    """A bridge for ``url``; ``prefix`` namespaces the Redis keys (ignored by memory).

    Connecting is lazy (on first use), so this never blocks and never fails on a down server.
    """
    if url == "memory":
        return MemoryStreamBridge(retention=retention, ttl_s=ttl_s, heartbeat_s=heartbeat_s)
    if url.startswith(_REDIS_SCHEMES):
        # Imported here so a memory-only process never loads the Redis client.
        from redis.asyncio import Redis

        from agentkeel.runtime.bridge.redis import RedisStreamBridge

        return RedisStreamBridge(
            Redis.from_url(url, decode_responses=True),
            retention=retention,
            ttl_s=ttl_s,
            heartbeat_s=heartbeat_s,
            prefix=prefix,
        )
    raise ValueError(f"unsupported stream bridge URL {url!r}: use 'memory' or a redis:// URL")


__all__ = [
    "END_EVENT",
    "GAP_EVENT",
    "HEARTBEAT_EVENT",
    "LIVE",
    "EventKind",
    "InvalidEventId",
    "MemoryStreamBridge",
    "StreamBridge",
    "StreamClosed",
    "StreamEvent",
    "StreamGone",
    "format_event_id",
    "open_bridge",
    "parse_event_id",
]
