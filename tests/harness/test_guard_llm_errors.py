"""LLMErrorHandling: bounded retries of transient provider failures, a clear error when they run out.

Driven through the real agent loop: the scripted model raises provider-shaped errors (every call,
failed or not, consumes one scripted turn), the sleep is injected and recorded.
"""

from __future__ import annotations

import asyncio
import random
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness, Outcome, run_agent
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage
from langgraph.errors import GraphInterrupt

from agentkeel.harness.middleware.base import HintQueue, KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.llm_error_handling import (
    LLMErrorHandling,
    ModelCallFailed,
    decorrelated_jitter,
    retry_after_ms,
)
from agentkeel.harness.middleware.responses import is_hint
from agentkeel.harness.provider_errors import classify
from agentkeel.harness.scripted import ScriptExhaustedError
from agentkeel.harness.scripted.errors import (
    ScriptedBadRequestError,
    ScriptedRateLimitError,
    ScriptedServerError,
    ScriptedTimeoutError,
    StrictRequestError,
)
from agentkeel.limits import LLMRetryLimits

LIMITS = LLMRetryLimits(max_attempts=3, base_delay_ms=10, max_delay_ms=40)


class Sleeps:
    """An injected sleep that records the waits (seconds) without waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def _script(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"agents": {"lead": list(turns)}}


def _fail(kind: str, repeat: int | str = 1) -> dict[str, Any]:
    return {"raise": {"kind": kind, "message": f"scripted {kind}"}, "repeat": repeat}


def _retries(out: Outcome) -> list[dict[str, Any]]:
    return [r["data"] for r in out.journal.kinds("intervention") if r["data"]["action"] == "retry"]


async def _run(tmp_path: Path, script: dict[str, Any], sleeps: Sleeps, *extra: Any,
               limits: LLMRetryLimits = LIMITS) -> Outcome:
    return await run_agent(script, [LLMErrorHandling(limits, sleep=sleeps), *extra], tmp_path / "ws")


async def test_a_rate_limit_is_retried(tmp_path: Path) -> None:
    sleeps = Sleeps()
    out = await _run(tmp_path, _script(_fail("rate_limit"), {"say": "the answer"}), sleeps)
    assert out.messages[-1].content == "the answer"
    assert len(out.requests) == 2
    (wait,) = sleeps.waits
    assert 0.010 <= wait <= 0.040
    (retry,) = _retries(out)
    assert retry["attempt"] == 1 and retry["max_attempts"] == 3
    assert retry["wait_ms"] == round(wait * 1000) and retry["reason"] == "rate_limit"
    assert retry["error"] == "ScriptedRateLimitError: scripted rate_limit"
    assert out.codes == []


@pytest.mark.parametrize("kind", ["server_error", "timeout"])
async def test_server_errors_and_timeouts_are_retried_up_to_the_limit(tmp_path: Path, kind: str) -> None:
    sleeps = Sleeps()
    out = await _run(tmp_path, _script(_fail(kind, 2), {"say": "the answer"}), sleeps)
    assert out.messages[-1].content == "the answer"
    assert len(out.requests) == 3 and len(sleeps.waits) == 2
    assert all(0.010 <= w <= 0.040 for w in sleeps.waits)
    assert [r["attempt"] for r in _retries(out)] == [1, 2]
    # No failed attempt leaves a trace in the conversation.
    assert [type(m).__name__ for m in out.messages] == ["HumanMessage", "AIMessage"]


async def test_a_bad_request_is_not_retried(tmp_path: Path) -> None:
    sleeps = Sleeps()
    with pytest.raises(ModelCallFailed) as info:
        await _run(tmp_path, _script(_fail("bad_request"), {"say": "never"}), sleeps)
    assert str(info.value) == (
        "model call refused after 1 attempt (invalid_request, HTTP 400): ScriptedBadRequestError: scripted bad_request"
    )
    assert info.value.kind == "invalid_request" and isinstance(info.value.__cause__, ScriptedBadRequestError)
    assert sleeps.waits == []


async def test_exhaustion_raises_model_call_failed_out_of_the_run(tmp_path: Path) -> None:
    sleeps = Sleeps()
    harness = GuardHarness(_script(_fail("rate_limit", "forever")), [LLMErrorHandling(LIMITS, sleep=sleeps)],
                           tmp_path / "ws")
    with pytest.raises(ModelCallFailed) as info:
        await harness.run()
    error = info.value
    assert str(error) == (
        "model call failed after 3 attempts (rate_limit, HTTP 429): ScriptedRateLimitError: scripted rate_limit"
    )
    assert error.attempts == 3
    assert isinstance(error.__cause__, ScriptedRateLimitError)
    assert len(harness.log.requests) == 3 and len(sleeps.waits) == 2
    # No fake assistant message was made up.
    state = await harness.graph.aget_state({"configurable": {"thread_id": harness.thread_id}})
    assert not any(isinstance(m, AIMessage) for m in state.values.get("messages", []))


async def test_a_single_attempt_budget_fails_at_once(tmp_path: Path) -> None:
    sleeps = Sleeps()
    with pytest.raises(ModelCallFailed, match=r"after 1 attempt \(server_error, HTTP 500\): ScriptedServerError"):
        await _run(tmp_path, _script(_fail("server_error"), {"say": "x"}), sleeps,
                   limits=LLMRetryLimits(max_attempts=1, base_delay_ms=10, max_delay_ms=10))
    assert sleeps.waits == []


class _RetryAfter(Exception):
    """An SDK-style 429 whose response carries headers."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("slow down")
        self.status_code = 429
        self.response = type("Response", (), {"headers": headers, "status_code": 429})()


class _FailFirst(AgentMiddleware):
    """Inner test layer: the first model call fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error: Exception | None = error

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return await handler(request)


@pytest.mark.parametrize(("headers", "wait"), [({"Retry-After": "2"}, 2.0), ({"retry-after-ms": "1500"}, 1.5)])
async def test_the_providers_retry_after_header_is_honoured(tmp_path: Path, headers: dict[str, str],
                                                            wait: float) -> None:
    sleeps = Sleeps()
    out = await _run(tmp_path, _script({"say": "ok"}), sleeps, _FailFirst(_RetryAfter(headers)))
    assert sleeps.waits == [wait]
    assert out.messages[-1].content == "ok"


async def test_retries_are_announced_on_the_custom_stream(tmp_path: Path) -> None:
    harness = GuardHarness(_script(_fail("server_error"), {"say": "ok"}), [LLMErrorHandling(LIMITS, sleep=Sleeps())],
                           tmp_path / "ws")
    config = {"configurable": {"thread_id": "t1"}}
    custom = [chunk async for mode, chunk in harness.graph.astream(
        {"messages": [("user", "go")]}, config, context=harness.context(), stream_mode=["custom", "updates"],
    ) if mode == "custom"]
    (event,) = custom
    assert event["type"] == "llm_retry" and event["attempt"] == 1 and event["max_attempts"] == 3
    assert 10 <= event["wait_ms"] <= 40 and event["error"].startswith("ScriptedServerError")


class _NoteHolder(KeelMiddleware):
    """A guard with a pending warning, inner of LLMErrorHandling (as every hinting guard is)."""

    contract = Contract(axes={"model": on(mutates={"model_request.messages"})})

    def __init__(self) -> None:
        super().__init__()
        self.queue = HintQueue("test_warning")
        self.queue.push("[TEST WARNING] slow down")

    async def awrap_model_call(self, request: Any, handler: ModelHandler) -> Any:
        handler = self.traced(request, handler)
        request, sent = self.queue.apply(request)
        response = await handler(request)
        self.queue.delivered(sent)
        return response


async def test_queued_warnings_survive_a_retry(tmp_path: Path) -> None:
    sleeps = Sleeps()
    ls = {"tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}]}
    out = await _run(tmp_path, _script(_fail("rate_limit"), ls, {"say": "done"}), sleeps, _NoteHolder())
    failed, retried, after = out.requests
    for request in (failed, retried):
        assert is_hint(request[-1]) and request[-1].content == "[TEST WARNING] slow down"
    # Delivered exactly once: the answered retry carried it, later requests and the state do not.
    answered_with_note = [r for r in (retried, after) if any(is_hint(m) for m in r)]
    assert answered_with_note == [retried]
    assert not any(is_hint(m) for m in out.messages)
    assert len(sleeps.waits) == 1 and out.messages[-1].content == "done"


# -- classification and delays (pure) ----------------------------------------------------------


class APITimeoutError(Exception):
    pass


class APIConnectionError(Exception):
    pass


class InternalServerError(Exception):
    pass


class RateLimitError(Exception):
    pass


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


class _ResponseStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.response = type("Response", (), {"status_code": status, "headers": {}})()


@pytest.mark.parametrize(("error", "kind"), [
    (ScriptedRateLimitError("x"), "rate_limit"),
    (ScriptedServerError("x"), "server_error"),
    (ScriptedTimeoutError("x"), "timeout"),
    (TimeoutError(), "timeout"),
    (APITimeoutError(), "timeout"),
    (APIConnectionError(), "connection"),
    (ConnectionResetError(), "connection"),
    (InternalServerError(), "server_error"),
    (RateLimitError(), "rate_limit"),
    (_Status(503), "server_error"),
    (_ResponseStatus(502), "server_error"),
    (_Status(408), "timeout"),
    (_Status(409), "conflict"),
    (_Status(429), "rate_limit"),
    (_Status(400), "invalid_request"),
    (_Status(401), "auth"),
    (_Status(403), "auth"),
    (_Status(404), "not_found"),
    (_ResponseStatus(422), "invalid_request"),
    (ScriptedBadRequestError("x"), "invalid_request"),
    (StrictRequestError(3, "rule", 2, "detail"), "invalid_request"),
    (ScriptExhaustedError("lead", 0, 4), None),
    (GraphInterrupt(), None),
    (asyncio.CancelledError(), None),
    (ValueError("bad"), None),
])
def test_classification(error: BaseException, kind: str | None) -> None:
    assert classify(error).kind == kind


def test_retry_after_parsing() -> None:
    assert retry_after_ms(_RetryAfter({"retry-after": "3"})) == 3000
    assert retry_after_ms(_RetryAfter({"Retry-After-Ms": "250", "Retry-After": "9"})) == 250
    assert retry_after_ms(_RetryAfter({"retry-after": formatdate(1_000_010, usegmt=True)}), now=1_000_000) == 10_000
    assert retry_after_ms(_RetryAfter({"retry-after": "soon"})) is None
    assert retry_after_ms(_RetryAfter({})) is None
    assert retry_after_ms(ValueError()) is None


@given(st.integers(0, 100_000), st.integers(0, 5_000), st.integers(0, 20_000), st.integers(0, 2**32))
def test_jitter_stays_within_bounds(previous: int, base: int, extra: int, seed: int) -> None:
    cap = base + extra
    wait = decorrelated_jitter(previous, base, cap, random.Random(seed))
    assert base <= wait <= cap
    assert wait <= max(base, previous * 3)


async def test_cancellation_and_interrupts_propagate_without_retry() -> None:
    sleeps = Sleeps()
    guard = LLMErrorHandling(LIMITS, sleep=sleeps)
    request: Any = type("Request", (), {"runtime": None})()
    for error in (asyncio.CancelledError(), GraphInterrupt()):
        calls = 0

        async def handler(_: Any, error: BaseException = error) -> Any:
            nonlocal calls
            calls += 1
            raise error

        with pytest.raises(type(error)):
            await guard.awrap_model_call(request, handler)
        assert calls == 1
    assert sleeps.waits == []
