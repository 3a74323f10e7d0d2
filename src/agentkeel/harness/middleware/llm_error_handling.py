"""Bounded retries of transient provider failures, and an honest error when they run out.

Providers fail transiently all the time — rate limits, 5xx, timeouts, dropped connections — and a
long run should not die of one. Other failures must not be retried: a bad request or a rejected key
fails the same way again, graph control flow (``GraphBubbleUp``) is not a failure, and a cancel
(``CancelledError``, not an ``Exception``) must stop at once.

Retries re-run the *inner* chain, so inner guards see the retried request again. That is why hint
queues commit only after the provider answered (:class:`~agentkeel.harness.middleware.base.HintQueue`):
a warning queued for the failed call is still on the retried one.

When the attempts run out the run fails with :class:`ModelCallFailed`, naming the attempt count and
the last error. No fake assistant message is made up: a run that could not reach its model did not
succeed, and must not look as if the model had answered.

The wait before a retry honours the provider's ``retry-after-ms`` / ``Retry-After`` header, else is
a decorrelated jitter in ``[base_delay_ms, max_delay_ms]``. Each retry is journaled as an
intervention and announced on the custom stream (``{"type": "llm_retry", ...}``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langgraph.config import get_stream_writer
from langgraph.errors import GraphBubbleUp

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.limits import LLMRetryLimits

Sleep = Callable[[float], Awaitable[Any]]

# 4xx statuses that say "try again" rather than "your request is wrong".
_RETRIABLE_4XX = {408: "timeout", 409: "conflict", 429: "rate_limit"}
# Class-name fragments of SDK exceptions that carry no status (checked along the MRO).
_NAME_REASONS: tuple[tuple[str, str], ...] = (
    ("RateLimit", "rate_limit"),
    ("InternalServerError", "server_error"),
    ("Timeout", "timeout"),
    ("Connection", "connection"),
)


class ModelCallFailed(RuntimeError):
    """The model could not be reached within the retry budget; chained from the last error."""

    def __init__(self, attempts: int, error: BaseException) -> None:
        super().__init__(f"model call failed after {attempts} attempts: {type(error).__name__}: {error}")
        self.attempts = attempts
        self.error = error


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK exception carries (``status_code``, or its response's)."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int):
            return status
    return None


def retry_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is worth retrying (``rate_limit``, ``server_error``, ``timeout``, ``conflict``,
    ``connection``), or None when it is not."""
    if not isinstance(exc, Exception) or isinstance(exc, GraphBubbleUp):  # CancelledError is neither
        return None
    status = status_of(exc)
    if status is not None:
        if status >= 500:
            return "server_error"
        return _RETRIABLE_4XX.get(status) if status >= 400 else None
    if isinstance(exc, TimeoutError):
        return "timeout"
    names = [cls.__name__ for cls in type(exc).__mro__]
    for fragment, reason in _NAME_REASONS:
        if any(fragment in name for name in names):
            return reason
    return None


def _headers(exc: BaseException) -> Mapping[str, str] | None:
    for holder in (getattr(exc, "response", None), exc):
        headers = getattr(holder, "headers", None)
        if headers is not None and hasattr(headers, "get"):
            return headers
    return None


def retry_after_ms(exc: BaseException, now: float | None = None) -> int | None:
    """The wait the provider asked for (``retry-after-ms``, or ``Retry-After`` in seconds or as
    an HTTP date), in milliseconds; None when the exception carries no usable header."""
    headers = _headers(exc)
    if headers is None:
        return None
    lowered = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0, int(float(lowered["retry-after-ms"])))
        if "retry-after" in lowered:
            value = lowered["retry-after"].strip()
            try:
                return max(0, int(float(value) * 1000))
            except ValueError:
                when = parsedate_to_datetime(value).timestamp()
                return max(0, int((when - (time.time() if now is None else now)) * 1000))
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def decorrelated_jitter(previous_ms: int, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """The next wait: uniform in ``[base, min(cap, max(base, 3 * previous))]``."""
    upper = min(cap_ms, max(base_ms, previous_ms * 3))
    return (rng or random).randint(base_ms, max(base_ms, upper))


def _emit(event: dict[str, Any]) -> None:
    """Best effort: outside a streamed graph (or without ``custom`` mode) there is no writer."""
    try:
        get_stream_writer()(event)
    except Exception:
        pass


class LLMErrorHandling(KeelMiddleware):
    """Retries transient model-call failures with backoff; raises ModelCallFailed when they run out."""

    contract = Contract(
        axes={"model": on(reads={"model_response"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self, limits: LLMRetryLimits, sleep: Sleep = asyncio.sleep) -> None:
        super().__init__()
        self.limits = limits
        self._sleep = sleep

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        limits = self.limits
        previous_ms = limits.base_delay_ms
        attempt = 1
        while True:
            try:
                return await handler(request)
            except Exception as exc:
                reason = retry_reason(exc)
                if reason is None:
                    raise
                if attempt >= limits.max_attempts:
                    raise ModelCallFailed(attempt, exc) from exc
                wait_ms = retry_after_ms(exc)
                if wait_ms is None:
                    wait_ms = previous_ms = decorrelated_jitter(previous_ms, limits.base_delay_ms, limits.max_delay_ms)
                error = f"{type(exc).__name__}: {exc}"[:500]
                self.intervene(
                    request.runtime, "retry",
                    f"model call attempt {attempt}/{limits.max_attempts} failed ({reason}); retrying in {wait_ms} ms",
                    attempt=attempt, max_attempts=limits.max_attempts, wait_ms=wait_ms, error=error, reason=reason,
                )
                _emit({
                    "type": "llm_retry", "attempt": attempt, "max_attempts": limits.max_attempts,
                    "wait_ms": wait_ms, "reason": reason, "error": error,
                })
                await self._sleep(wait_ms / 1000)
                attempt += 1


__all__ = [
    "LLMErrorHandling",
    "ModelCallFailed",
    "decorrelated_jitter",
    "retry_after_ms",
    "retry_reason",
    "status_of",
]
