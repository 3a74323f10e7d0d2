"""Bounded retries of transient provider failures, and an honest error when a call cannot succeed.

Providers fail transiently all the time — rate limits, 5xx, timeouts, dropped connections — and a
long run should not die of one. Other failures must not be retried: a rejected key, an exhausted
quota, a malformed request, a prompt over the context window or an unknown model fail the same way
again (:mod:`agentkeel.harness.provider_errors` says which is which); graph control flow
(``GraphBubbleUp``) is not a failure, and a cancel (``CancelledError``, not an ``Exception``) must
stop at once.

This is the *only* retry layer: the provider clients are built with their own retries off, so
``limits.llm_retry.max_attempts`` is the number of requests one model call makes, and every retry
is visible here — journaled as an intervention (attempt, HTTP status, wait, kind) and announced on
the custom stream (``{"type": "llm_retry", ...}``).

Each attempt is bounded by the model's ``timeout_s`` of silence: a call that has sent nothing for
that long — no first token, or no next one — is abandoned and counts as a retriable ``timeout``, so
a provider that stops answering costs ``timeout_s`` per attempt, not the run's whole wall-clock
limit; a long answer that keeps streaming is never cut off.

Retries re-run the *inner* chain, so inner guards see the retried request again. That is why hint
queues commit only after the provider answered (:class:`~agentkeel.harness.middleware.base.HintQueue`):
a warning queued for the failed call is still on the retried one.

When the attempts run out, or the error is one no retry can fix, the run fails with
:class:`ModelCallFailed`, naming the kind, the HTTP status, the model (configured name and
``provider:model``), the provider's message, the attempt count and — for a rejected key — the
environment variable the key was read from. No fake assistant message is made up: a run that could
not reach its model did not succeed, and must not look as if the model had answered. A request over
the model's context window also records the stop reason ``context_length_capped`` (class
``limit``): the run ended where it did because its conversation outgrew the model.

The wait before a retry honours the provider's ``retry-after-ms`` / ``Retry-After`` header, capped
at ``limits.llm_retry.max_retry_after_ms`` (a provider asking for an hour must not park the run
for one; the journal records the asked and the capped wait), else is a decorrelated jitter in
``[base_delay_ms, max_delay_ms]``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from uuid import UUID

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langgraph.config import get_stream_writer

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.listen import TokenListener, listening
from agentkeel.harness.provider_errors import ProviderError, classify
from agentkeel.limits import LLMRetryLimits

Sleep = Callable[[float], Awaitable[Any]]

# What the user can do about a final error, appended to its message.
_HINTS = {
    "quota": "the provider account has no quota left (a billing stop, not a rate limit)",
    "context_length": "the request no longer fits the model's context window",
    "not_found": "check the model name in models[].use",
}


@dataclass(frozen=True)
class ModelRef:
    """The configured model a chain calls: what error messages name, and one call's bound."""

    name: str  # the configured ``models[].name``
    use: str  # ``provider:model`` (or ``scripted``)
    key_env: str | None = None  # ``models[].api_key_env``
    timeout_s: float | None = None  # bound of one attempt; None: unbounded


class AttemptTimedOut(TimeoutError):
    """One attempt received nothing for the model's ``timeout_s`` and was abandoned."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"nothing received for {timeout_s:g} s (models[].timeout_s); the call was abandoned")
        self.timeout_s = timeout_s


class _Progress(TokenListener):
    """Pushes an attempt's deadline back by ``timeout_s`` on every streamed token.

    So ``timeout_s`` bounds the silence of a call — the wait for its first token, and between two
    tokens — not the length of an answer that keeps streaming: a long generation on a slow model
    is not cut off and re-sent, a provider that stops sending is abandoned. A call that is not
    streamed has no tokens to report, so for it ``timeout_s`` bounds the whole call.
    Inline (``TokenListener``): called on the event loop's thread, where the scope may be rescheduled.
    """

    def __init__(self, scope: asyncio.Timeout, timeout_s: float) -> None:
        self._scope = scope
        self._timeout_s = timeout_s

    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if not self._scope.expired():
            self._scope.reschedule(asyncio.get_running_loop().time() + self._timeout_s)


class ModelCallFailed(RuntimeError):
    """The model call cannot succeed: its attempts ran out, or the provider refused it for a reason
    no retry fixes. Chained from the last error; :meth:`detail` is the run's ``error_detail``."""

    def __init__(self, attempts: int, error: BaseException, info: ProviderError | None = None,
                 model: ModelRef | None = None) -> None:
        self.attempts = attempts
        self.error = error
        self.info = info or classify(error)
        self.model = model
        super().__init__(self._describe())

    @property
    def kind(self) -> str | None:
        return self.info.kind

    def _describe(self) -> str:
        info = self.info
        what = ", ".join(p for p in (info.kind, info.status and f"HTTP {info.status}") if p)
        plural = "attempt" if self.attempts == 1 else "attempts"
        head = (f"model call failed after {self.attempts} {plural}" if info.retriable
                else f"model call refused after {self.attempts} {plural}")
        text = f"{head} ({what})" if what else head
        if self.model is not None:
            text += f" — model {self.model.name!r} ({self.model.use})"
        text += f": {type(self.error).__name__}: {info.message}"
        if info.kind == "auth":
            key = self.model.key_env if self.model is not None else None
            text += (f"; check the API key in the environment variable {key}" if key
                     else "; check the model's API key (models[].api_key_env)")
        elif info.kind in _HINTS:
            text += f"; {_HINTS[info.kind]}"
        return text

    def detail(self) -> dict[str, Any]:
        """Structured detail for the run record and the ledger."""
        return {
            "type": type(self.error).__name__,
            "message": self.info.message[:2000],
            "kind": self.info.kind,
            "status": self.info.status,
            "code": self.info.code,
            "attempts": self.attempts,
            "model": self.model.name if self.model else None,
            "use": self.model.use if self.model else None,
            "key_env": self.model.key_env if self.model and self.info.kind == "auth" else None,
        }


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
    """Retries transient model-call failures with backoff, bounds each attempt by the model's
    ``timeout_s``; raises ModelCallFailed when attempts run out or the call cannot succeed."""

    contract = Contract(
        axes={"model": on(reads={"model_response"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self, limits: LLMRetryLimits, sleep: Sleep = asyncio.sleep, model: ModelRef | None = None) -> None:
        super().__init__()
        self.limits = limits
        self.model = model
        self._sleep = sleep

    async def _attempt(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        timeout_s = self.model.timeout_s if self.model is not None else None
        if timeout_s is None:
            return await handler(request)
        scope = asyncio.timeout(timeout_s)
        try:
            async with scope:
                with listening(_Progress(scope, timeout_s)):
                    return await handler(request)
        except TimeoutError:
            if scope.expired():
                raise AttemptTimedOut(timeout_s) from None
            raise

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        limits = self.limits
        previous_ms = limits.base_delay_ms
        attempt = 1
        while True:
            try:
                return await self._attempt(request, handler)
            except Exception as exc:
                info = classify(exc)
                if info.kind is None:
                    raise
                if not info.retriable or attempt >= limits.max_attempts:
                    failed = ModelCallFailed(attempt, exc, info, self.model)
                    if info.kind == "context_length":
                        await self.stop(request.runtime, "context_length_capped", str(failed),
                                        data={"status": info.status, "code": info.code, "message": info.message[:500]})
                    raise failed from exc
                asked_ms = retry_after_ms(exc)
                if asked_ms is None:
                    wait_ms = previous_ms = decorrelated_jitter(previous_ms, limits.base_delay_ms, limits.max_delay_ms)
                else:
                    wait_ms = min(asked_ms, limits.max_retry_after_ms)
                self._announce(request, attempt, info, exc, wait_ms, asked_ms)
                await self._sleep(wait_ms / 1000)
                attempt += 1

    def _announce(self, request: ModelRequest, attempt: int, info: ProviderError, exc: Exception,
                  wait_ms: int, asked_ms: int | None) -> None:
        """Journal the retry (attempt, status, wait, kind) and announce it on the custom stream."""
        limits = self.limits
        error = f"{type(exc).__name__}: {exc}"[:500]
        status = f", HTTP {info.status}" if info.status is not None else ""
        detail = (f"model call attempt {attempt}/{limits.max_attempts} failed ({info.kind}{status}); "
                  f"retrying in {wait_ms} ms")
        capped = asked_ms is not None and asked_ms > wait_ms
        if capped:
            detail += f" (the provider asked for {asked_ms} ms; capped by limits.llm_retry.max_retry_after_ms)"
        data: dict[str, Any] = {
            "attempt": attempt, "max_attempts": limits.max_attempts, "wait_ms": wait_ms,
            "reason": info.kind, "status": info.status, "error": error,
            "requested_wait_ms": asked_ms, "capped": capped,
        }
        if self.model is not None:
            data["model"] = self.model.name
        self.intervene(request.runtime, "retry", detail, **data)
        _emit({"type": "llm_retry", **data})


__all__ = [
    "AttemptTimedOut",
    "LLMErrorHandling",
    "ModelCallFailed",
    "ModelRef",
    "decorrelated_jitter",
    "retry_after_ms",
]
