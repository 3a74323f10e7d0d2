"""Provider errors as the real SDKs raise them: classified, retried only when a retry can help,
and ending the run with an error that names the model, the provider's message and the key to check.

The exceptions are the real ``openai`` / ``anthropic`` classes built from real ``httpx.Response``
objects, shaped as each SDK builds them from an error response (OpenAI keeps the inner ``error``
object as ``body``; Anthropic keeps the whole ``{"type": "error", "error": ...}``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from guard_kit import GuardHarness, Outcome, run_agent, script
from langchain.agents.middleware import AgentMiddleware

from agentkeel.harness.middleware.llm_error_handling import (
    AttemptTimedOut,
    LLMErrorHandling,
    ModelCallFailed,
    ModelRef,
)
from agentkeel.harness.provider_errors import classify
from agentkeel.harness.stop_reasons import STOP_REASON_CLASSES
from agentkeel.limits import LLMRetryLimits

LIMITS = LLMRetryLimits(max_attempts=3, base_delay_ms=10, max_delay_ms=40, max_retry_after_ms=50)
GPT = ModelRef(name="gpt", use="openai:gpt-4.1-mini", key_env="OPENAI_API_KEY", timeout_s=None)
_OPENAI_URL = "http://127.0.0.1:9/v1/chat/completions"
_ANTHROPIC_URL = "http://127.0.0.1:9/v1/messages"


def _openai(cls: type[openai.APIStatusError], status: int, error: dict[str, Any],
            headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx.Response(status, json={"error": error}, headers=headers,
                              request=httpx.Request("POST", _OPENAI_URL))
    return cls(f"Error code: {status} - {{'error': {error}}}", response=response, body=error)


def _anthropic(cls: type[anthropic.APIStatusError], status: int, kind: str, message: str) -> anthropic.APIStatusError:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    response = httpx.Response(status, json=body, request=httpx.Request("POST", _ANTHROPIC_URL))
    return cls(f"Error code: {status} - {body}", response=response, body=body)


def _quota() -> openai.APIStatusError:
    return _openai(openai.RateLimitError, 429, {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota", "param": None, "code": "insufficient_quota"})


def _rate_limited(retry_after: str = "3600") -> openai.APIStatusError:
    return _openai(openai.RateLimitError, 429, {
        "message": "Rate limit reached for requests", "type": "requests", "param": None,
        "code": "rate_limit_exceeded"}, headers={"retry-after": retry_after})


def _bad_key() -> openai.APIStatusError:
    return _openai(openai.AuthenticationError, 401, {
        "message": "Incorrect API key provided: sk-wrong.", "type": "invalid_request_error",
        "param": None, "code": "invalid_api_key"})


def _too_long() -> openai.APIStatusError:
    return _openai(openai.BadRequestError, 400, {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted "
                   "in 130000 tokens.", "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"})


OPENAI_CASES = [
    (_rate_limited(), "rate_limit", 429),
    (_quota(), "quota", 429),
    (_bad_key(), "auth", 401),
    (_openai(openai.PermissionDeniedError, 403, {"message": "Project does not have access", "type": None,
                                                 "code": "model_not_allowed"}), "auth", 403),
    (_too_long(), "context_length", 400),
    (_openai(openai.BadRequestError, 400, {"message": "Invalid value for 'temperature'", "type": "invalid_request_error",
                                           "param": "temperature", "code": "invalid_value"}), "invalid_request", 400),
    (_openai(openai.NotFoundError, 404, {"message": "The model `gpt-9` does not exist", "type": "invalid_request_error",
                                         "code": "model_not_found"}), "not_found", 404),
    (_openai(openai.UnprocessableEntityError, 422, {"message": "bad"}), "invalid_request", 422),
    (_openai(openai.InternalServerError, 500, {"message": "The server had an error"}), "server_error", 500),
    (_openai(openai.InternalServerError, 503, {"message": "overloaded"}), "server_error", 503),
    (openai.APITimeoutError(request=httpx.Request("POST", _OPENAI_URL)), "timeout", None),
    (openai.APIConnectionError(request=httpx.Request("POST", _OPENAI_URL)), "connection", None),
]
ANTHROPIC_CASES = [
    (_anthropic(anthropic.AuthenticationError, 401, "authentication_error", "invalid x-api-key"), "auth", 401),
    (_anthropic(anthropic.PermissionDeniedError, 403, "permission_error", "no access"), "auth", 403),
    (_anthropic(anthropic.BadRequestError, 400, "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum"), "context_length", 400),
    (_anthropic(anthropic.BadRequestError, 400, "invalid_request_error", "messages.1.content: empty"),
     "invalid_request", 400),
    (_anthropic(anthropic.NotFoundError, 404, "not_found_error", "model: claude-9"), "not_found", 404),
    (_anthropic(anthropic.RateLimitError, 429, "rate_limit_error", "slow down"), "rate_limit", 429),
    (_anthropic(anthropic.InternalServerError, 529, "overloaded_error", "Overloaded"), "server_error", 529),
    (anthropic.APITimeoutError(request=httpx.Request("POST", _ANTHROPIC_URL)), "timeout", None),
]


@pytest.mark.parametrize(("error", "kind", "status"), OPENAI_CASES + ANTHROPIC_CASES,
                         ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_real_sdk_exceptions_are_classified(error: Exception, kind: str, status: int | None) -> None:
    info = classify(error)
    assert (info.kind, info.status) == (kind, status)
    assert info.message and not info.message.startswith("Error code")  # the provider's own words


class _Raises(AgentMiddleware):
    """Inner layer standing in for the provider: raises ``errors`` in turn (the last one forever
    when ``forever``), then lets the scripted model answer. Counts the requests."""

    def __init__(self, *errors: Exception, forever: bool = False) -> None:
        super().__init__()
        self.errors, self.forever, self.calls = list(errors), forever, 0

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors[0] if self.forever and len(self.errors) == 1 else self.errors.pop(0)
        return await handler(request)


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def _retries(out: Any) -> list[dict[str, Any]]:
    return [r["data"] for r in out.journal.kinds("intervention") if r["data"]["action"] == "retry"]


async def _fail_run(tmp_path: Path, provider: _Raises, sleeps: Sleeps,
                    model: ModelRef = GPT) -> tuple[ModelCallFailed, GuardHarness]:
    harness = GuardHarness(script({"say": "never"}), [LLMErrorHandling(LIMITS, sleep=sleeps, model=model), provider],
                           tmp_path / "ws")
    with pytest.raises(ModelCallFailed) as info:
        await harness.run()
    return info.value, harness


@pytest.mark.parametrize(("error", "kind"), [
    (_bad_key(), "auth"), (_quota(), "quota"), (_too_long(), "context_length"),
    (OPENAI_CASES[5][0], "invalid_request"), (OPENAI_CASES[6][0], "not_found"),
    (ANTHROPIC_CASES[0][0], "auth"), (ANTHROPIC_CASES[2][0], "context_length"),
])
async def test_what_cannot_succeed_is_never_retried(tmp_path: Path, error: Exception, kind: str) -> None:
    sleeps, provider = Sleeps(), _Raises(error, forever=True)
    failed, harness = await _fail_run(tmp_path, provider, sleeps)
    assert provider.calls == 1 and sleeps.waits == []
    assert failed.kind == kind and failed.__cause__ is error
    assert str(failed).startswith(f"model call refused after 1 attempt ({kind}, HTTP {classify(error).status})"
                                  " — model 'gpt' (openai:gpt-4.1-mini): ")
    detail = failed.detail()
    assert detail["type"] == type(error).__name__ and detail["kind"] == kind and detail["attempts"] == 1
    assert detail["model"] == "gpt" and detail["use"] == "openai:gpt-4.1-mini"
    assert detail["message"] == classify(error).message
    assert detail["key_env"] == ("OPENAI_API_KEY" if kind == "auth" else None)
    codes = [e["code"] for e in harness.collector.entries]
    assert codes == (["context_length_capped"] if kind == "context_length" else [])


async def test_a_rejected_key_names_the_model_and_the_key_variable(tmp_path: Path) -> None:
    failed, _ = await _fail_run(tmp_path, _Raises(_bad_key(), forever=True), Sleeps())
    assert str(failed) == (
        "model call refused after 1 attempt (auth, HTTP 401) — model 'gpt' (openai:gpt-4.1-mini): "
        "AuthenticationError: Incorrect API key provided: sk-wrong.; check the API key in the environment "
        "variable OPENAI_API_KEY"
    )


async def test_a_billing_stop_says_so_instead_of_rate_limited(tmp_path: Path) -> None:
    failed, _ = await _fail_run(tmp_path, _Raises(_quota(), forever=True), Sleeps())
    assert "(quota, HTTP 429)" in str(failed) and "a billing stop, not a rate limit" in str(failed)


def test_context_length_capped_is_a_limit_stop_reason() -> None:
    assert STOP_REASON_CLASSES["context_length_capped"] == "limit"


async def test_a_persistent_429_makes_exactly_max_attempts_requests(tmp_path: Path) -> None:
    sleeps, provider = Sleeps(), _Raises(_rate_limited("3600"), forever=True)
    failed, harness = await _fail_run(tmp_path, provider, sleeps)
    assert provider.calls == LIMITS.max_attempts == failed.attempts
    assert str(failed).startswith("model call failed after 3 attempts (rate_limit, HTTP 429) — model 'gpt'")
    # The provider asked for an hour; each wait was capped and the journal says so.
    assert sleeps.waits == [0.05, 0.05]
    retries = _retries(Outcome([], [], harness.journal, []))
    assert [(r["attempt"], r["status"], r["wait_ms"], r["requested_wait_ms"], r["capped"]) for r in retries] == [
        (1, 429, 50, 3_600_000, True), (2, 429, 50, 3_600_000, True)]
    assert all(r["reason"] == "rate_limit" and r["model"] == "gpt" for r in retries)


async def test_a_retry_after_under_the_cap_is_honoured_and_recorded(tmp_path: Path) -> None:
    sleeps, provider = Sleeps(), _Raises(_rate_limited("0.02"))
    out = await run_agent(script({"say": "ok"}), [LLMErrorHandling(LIMITS, sleep=sleeps, model=GPT), provider],
                          tmp_path / "ws")
    assert out.messages[-1].content == "ok" and provider.calls == 2 and sleeps.waits == [0.02]
    (retry,) = _retries(out)
    assert (retry["status"], retry["wait_ms"], retry["requested_wait_ms"], retry["capped"]) == (429, 20, 20, False)


async def test_a_stalled_call_is_abandoned_and_retried(tmp_path: Path) -> None:
    model = ModelRef(name="slow", use="scripted", timeout_s=0.2)
    turns = script({"say": "too late", "delay_ms": 30_000}, {"say": "in time"})
    started = time.monotonic()
    out = await run_agent(turns, [LLMErrorHandling(LIMITS, sleep=Sleeps(), model=model)], tmp_path / "ws")
    assert time.monotonic() - started < 5
    assert out.messages[-1].content == "in time"
    (retry,) = _retries(out)
    assert retry["reason"] == "timeout" and retry["status"] is None
    assert retry["error"].startswith("AttemptTimedOut: nothing received for 0.2 s")


async def test_a_model_that_never_answers_fails_after_max_attempts_timeouts(tmp_path: Path) -> None:
    model = ModelRef(name="slow", use="scripted", timeout_s=0.2)
    limits = LLMRetryLimits(max_attempts=2, base_delay_ms=0, max_delay_ms=0)
    harness = GuardHarness(script({"say": "never", "delay_ms": 30_000, "repeat": "forever"}),
                           [LLMErrorHandling(limits, sleep=Sleeps(), model=model)], tmp_path / "ws")
    started = time.monotonic()
    with pytest.raises(ModelCallFailed) as info:
        await harness.run()
    assert time.monotonic() - started < 5
    assert info.value.kind == "timeout" and info.value.attempts == 2
    assert isinstance(info.value.__cause__, AttemptTimedOut)
    assert str(info.value).startswith("model call failed after 2 attempts (timeout) — model 'slow' (scripted)")
