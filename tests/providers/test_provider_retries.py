"""The one retry layer over real HTTP: whole runs through the runtime, the real ``langchain-openai``
and ``langchain-anthropic`` packages built by AgentKeel's loader, against the provider stubs.

What is counted is what the stub received, so "exactly ``max_attempts`` requests" means requests
on the wire, not attempts our middleware believes it made.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from provider_support import STUB_KEY_ENV, StubServer

from agentkeel.config import KeelConfig
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.stores.base import JournalEvent

# langchain-openai caches one httpx client per base URL, bound to the loop that opened it.
pytestmark = pytest.mark.asyncio(loop_scope="session")

OPENAI = "openai:gpt-4.1-mini"
ANTHROPIC = "anthropic:claude-sonnet-4-5"
RETRY = {"max_attempts": 3, "base_delay_ms": 0, "max_delay_ms": 0}


@asynccontextmanager
async def _runtime(tmp_path: Path, stub: StubServer, use: str, *, retry: dict[str, Any] | None = None,
                   **model: Any) -> AsyncIterator[Runtime]:
    config = KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://", stream="memory",
        models=[{"name": "m", "use": use, "api_key_env": STUB_KEY_ENV, "base_url": stub.base_url, **model}],
        limits={"llm_retry": {**RETRY, **(retry or {})}},
        base_dir=tmp_path,
    )
    async with open_runtime(config) as rt:
        yield rt


async def _run(rt: Runtime, **request: Any) -> tuple[RunRecord, list[JournalEvent]]:
    record = await rt.manager.create(RunRequest(thread_id=f"t-{uuid.uuid4().hex[:8]}", input="hello", **request))
    async with asyncio.timeout(30):
        done = await rt.manager.wait(record.run_id)
    assert done is not None
    return done, await rt.journal.list(done.run_id)


def _retries(events: list[JournalEvent]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.kind == "intervention" and e.data["action"] == "retry"]


def _stub(request: pytest.FixtureRequest, use: str) -> StubServer:
    stub: StubServer = request.getfixturevalue("openai_stub" if use == OPENAI else "anthropic_stub")
    return stub


@pytest.mark.parametrize("use", [OPENAI, ANTHROPIC])
async def test_a_persistent_429_makes_exactly_max_attempts_requests(
    request: pytest.FixtureRequest, stub_key: str, tmp_path: Path, use: str,
) -> None:
    stub = _stub(request, use)
    stub.script({"error": "rate_limit", "retry_after": 0, "repeat": True})
    async with _runtime(tmp_path, stub, use) as rt:
        record, events = await _run(rt)
    assert len(stub.requests()) == 3
    assert record.status is RunStatus.error and record.error_detail is not None
    assert (record.error_detail["kind"], record.error_detail["attempts"], record.error_detail["status"]) == (
        "rate_limit", 3, 429)
    assert record.error is not None and "after 3 attempts (rate_limit, HTTP 429) — model 'm'" in record.error
    assert [(r["attempt"], r["status"]) for r in _retries(events)] == [(1, 429), (2, 429)]
    assert [(e.data["kind"], e.data["status"]) for e in events if e.kind == "model.error"] == [("rate_limit", 429)] * 3


@pytest.mark.parametrize(("use", "preset", "kind"), [
    (OPENAI, "insufficient_quota", "quota"),
    (OPENAI, "auth", "auth"),
    (OPENAI, "invalid_request", "invalid_request"),
    (OPENAI, "context_length", "context_length"),
    (ANTHROPIC, "auth", "auth"),
    (ANTHROPIC, "context_length", "context_length"),
])
async def test_what_cannot_succeed_is_sent_once_and_named(
    request: pytest.FixtureRequest, stub_key: str, tmp_path: Path, use: str, preset: str, kind: str,
) -> None:
    stub = _stub(request, use)
    stub.script({"error": preset, "repeat": True})
    async with _runtime(tmp_path, stub, use) as rt:
        record, events = await _run(rt)
    assert len(stub.requests()) == 1 and _retries(events) == []
    detail = record.error_detail
    assert record.status is RunStatus.error and detail is not None
    assert (detail["kind"], detail["attempts"], detail["model"], detail["use"]) == (kind, 1, "m", use)
    assert detail["key_env"] == (STUB_KEY_ENV if kind == "auth" else None)
    assert record.error is not None and f"refused after 1 attempt ({kind}, HTTP " in record.error
    assert detail["message"] and detail["message"] in record.error  # the provider's own words
    if kind == "auth":
        assert record.error.endswith(f"check the API key in the environment variable {STUB_KEY_ENV}")
    assert [e["code"] for e in record.stop_reasons] == (["context_length_capped"] if kind == "context_length" else [])


async def test_a_retry_after_of_an_hour_is_capped_and_journaled(
    openai_stub: StubServer, stub_key: str, tmp_path: Path,
) -> None:
    openai_stub.script({"error": "rate_limit", "retry_after": 3600}, {"text": "Done."})
    began = time.monotonic()
    async with _runtime(tmp_path, openai_stub, OPENAI, retry={"max_retry_after_ms": 100}) as rt:
        record, events = await _run(rt)
    assert time.monotonic() - began < 20
    assert record.status is RunStatus.success and len(openai_stub.requests()) == 2
    (retry,) = _retries(events)
    assert (retry["status"], retry["wait_ms"], retry["capped"]) == (429, 100, True)
    assert retry["requested_wait_ms"] >= 3_599_000  # retry-after-ms or Retry-After, both ask an hour


async def test_a_stalled_provider_is_abandoned_after_timeout_s_and_retried(
    openai_stub: StubServer, stub_key: str, tmp_path: Path,
) -> None:
    openai_stub.script({"delay_s": 3}, {"text": "Done."})
    began = time.monotonic()
    async with _runtime(tmp_path, openai_stub, OPENAI, timeout_s=0.5) as rt:
        record, events = await _run(rt)
    assert time.monotonic() - began < 8
    assert record.status is RunStatus.success and len(openai_stub.requests()) == 2
    (retry,) = _retries(events)
    assert retry["reason"] == "timeout" and retry["status"] is None
    # The abandoned request left no model.error (its SDK call was cancelled); the retry records it.
    assert [e.kind for e in events if e.kind.startswith("model.")] == ["model.call"]


@pytest.mark.parametrize("use", [OPENAI, ANTHROPIC])
async def test_a_long_answer_that_keeps_streaming_is_not_cut_off_by_timeout_s(
    request: pytest.FixtureRequest, stub_key: str, tmp_path: Path, use: str,
) -> None:
    # 12 events 0.15 s apart: 1.8 s in all, more than three times timeout_s, never silent for it.
    stub = _stub(request, use)
    stub.script({"text": "a long answer in many pieces", "chunks": 8, "pace_s": 0.15})
    async with _runtime(tmp_path, stub, use, timeout_s=0.5) as rt:
        record, events = await _run(rt, stream_mode=["messages-tuple"])
    (sent,) = stub.requests()
    assert sent["body"]["stream"] is True
    assert record.status is RunStatus.success and _retries(events) == []
    assert [e.kind for e in events if e.kind.startswith("model.")] == ["model.call"]
