"""Stream bridge: per-run event streams between workers and SSE subscribers.

``open_bridge`` picks the backend from the ``stream`` setting: ``memory`` (one process) or a
``redis://`` / ``rediss://`` / ``unix://`` URL (shared by every process of a deployment).
"""

from __future__ import annotations

from typing import Any

from agentkeel.runtime.bridge.base import (
    CURSOR_AHEAD_EVENT,
    END_EVENT,
    GAP_EVENT,
    HEARTBEAT_EVENT,
    LIVE,
    BridgeFault,
    EventKind,
    InvalidEventId,
    StreamBridge,
    StreamClosed,
    StreamEvent,
    StreamGone,
    ThreadWatch,
    TooManySubscribers,
    format_event_id,
    parse_event_id,
)
from agentkeel.runtime.bridge.memory import MemoryStreamBridge

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_bridge(
    url: str,
    *,
    retention: int,
    ttl_s: float,
    heartbeat_s: float,
    prefix: str = "agentkeel",
    max_subscribers: int | None = None,
    end_grace_s: float | None = None,
    run_max_bytes: int | None = None,
    max_bytes: int | None = None,
) -> StreamBridge:
    """A bridge for ``url``; ``prefix`` namespaces the Redis keys (ignored by memory);
    ``max_subscribers`` bounds this process's concurrent subscriptions (``None``: unbounded);
    ``end_grace_s`` is how long a stream outlives its END (``None``: ``ttl_s``); ``run_max_bytes``
    bounds each run's retained events in bytes on either backend, ``max_bytes`` all of this
    process's on the memory backend (Redis streams are shared by every process: Redis' own
    ``maxmemory`` bounds them together).

    Connecting is lazy (on first use), so this never blocks and never fails on a down server.
    """
    settings: dict[str, Any] = {
        "retention": retention, "ttl_s": ttl_s, "heartbeat_s": heartbeat_s, "max_subscribers": max_subscribers,
        "end_grace_s": end_grace_s,
    }
    if url == "memory":
        return MemoryStreamBridge(**settings, run_max_bytes=run_max_bytes, max_bytes=max_bytes)
    if url.startswith(_REDIS_SCHEMES):
        # Imported here so a memory-only process never loads the Redis client.
        from agentkeel.runtime.bridge.redis import RedisStreamBridge, open_clients

        publisher, subscriber = open_clients(url, heartbeat_s=heartbeat_s, max_subscribers=max_subscribers)
        return RedisStreamBridge(
            publisher, subscriber=subscriber, prefix=prefix, run_max_bytes=run_max_bytes, **settings
        )
    raise ValueError(f"unsupported stream bridge URL {url!r}: use 'memory' or a redis:// URL")


__all__ = [
    "CURSOR_AHEAD_EVENT",
    "END_EVENT",
    "GAP_EVENT",
    "HEARTBEAT_EVENT",
    "LIVE",
    "BridgeFault",
    "EventKind",
    "InvalidEventId",
    "MemoryStreamBridge",
    "StreamBridge",
    "StreamClosed",
    "StreamEvent",
    "StreamGone",
    "ThreadWatch",
    "TooManySubscribers",
    "format_event_id",
    "open_bridge",
    "parse_event_id",
]
