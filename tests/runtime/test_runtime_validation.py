"""A request that cannot become a run is refused before admission and leaves nothing behind."""

from __future__ import annotations

from typing import Any

import pytest
from runtime_support import (
    LIGHT_MATRIX,
    Keel,
    backend_matrix,
    new_thread_id,
    run_to_end,
)

from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RequestError, RunRequest

pytestmark = backend_matrix(LIGHT_MATRIX)

# (what is wrong, request fields, the field the error must name, the kind of refusal)
INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown assistant", {"assistant_id": "no-such-assistant"}, "assistant_id", "not_found"),
    ("model outside the allowlist", {"model_name": "gpt-unlisted"}, "context.model_name", "not_allowed"),
    ("model outside the allowlist, via context", {"context": {"model_name": "gpt-unlisted"}}, "context.model_name", "not_allowed"),
    ("model name of the wrong type", {"context": {"model_name": 42}}, "context.model_name", "invalid"),
    ("malformed input message", {"input": {"messages": [{"role": "alien", "content": "x"}]}}, "input.messages[0]", "invalid"),
    ("second message malformed",
     {"input": {"messages": [{"role": "user", "content": "ok"}, {"content": "no role"}]}}, "input.messages[1]", "invalid"),
    ("messages not a list", {"input": {"messages": "hello"}}, "input.messages", "invalid"),
    ("input of the wrong type", {"input": 42}, "input", "invalid"),
    ("unknown stream mode", {"stream_mode": ["values", "telepathy"]}, "stream_mode", "invalid"),
    ("stream mode of the wrong type", {"stream_mode": [1]}, "stream_mode", "invalid"),
    ("recursion limit not positive", {"config": {"recursion_limit": 0}}, "config.recursion_limit", "invalid"),
    ("timeout not positive", {"timeout_s": 0}, "timeout_s", "invalid"),
    ("command goto without a node", {"input": None, "command": {"goto": {"input": 1}}}, "command.goto.node", "invalid"),
    ("command goto list entry without a node",
     {"input": None, "command": {"goto": [{"node": ""}]}}, "command.goto.node", "invalid"),
]

BAD_THREAD_IDS = ["", "../escape", "a/b", ".hidden", "x" * 129, "spaces are bad"]


async def _nothing_stored(rt: Any, thread_id: str) -> None:
    assert await rt.store.list_runs(thread_id=thread_id) == []
    assert await rt.store.get_thread(thread_id) is None
    assert await rt.store.active_runs(thread_id) == []
    assert rt.manager.in_flight == 0


async def test_invalid_requests_are_refused_before_admission(keel: Keel) -> None:
    async with keel.open() as rt:
        for what, fields, field, problem in INVALID:
            thread = new_thread_id("invalid")
            with pytest.raises(RequestError) as caught:
                await rt.manager.create(RunRequest(thread_id=thread, **{"input": "hello", **fields}))
            assert (caught.value.field, caught.value.problem) == (field, problem), what
            await _nothing_stored(rt, thread)
        assert await rt.store.list_runs() == []
        assert await rt.store.list_threads() == []


async def test_bad_thread_ids_are_refused_before_admission(keel: Keel) -> None:
    async with keel.open() as rt:
        for thread in BAD_THREAD_IDS:
            with pytest.raises(RequestError) as caught:
                await rt.manager.create(RunRequest(thread_id=thread, input="hello"))
            assert caught.value.field == "thread_id", thread
            assert await rt.store.list_runs(thread_id=thread) == []
        assert await rt.store.list_runs() == [] and await rt.store.list_threads() == []
        assert not (keel.tmp_path / "data" / "threads").exists() or not any(
            (keel.tmp_path / "data" / "threads").iterdir()
        )


async def test_a_valid_request_after_refusals_is_the_only_run(keel: Keel) -> None:
    """The control: the same thread, refused then accepted, holds exactly the accepted run."""
    async with keel.open() as rt:
        thread = new_thread_id("control")
        with pytest.raises(RequestError):
            await rt.manager.create(RunRequest(thread_id=thread, input="hi", assistant_id="nope"))
        run = await run_to_end(rt, thread, "hi", context={"user": "mallory", "thread_id": "other", "note": 1})
        assert run.status == RunStatus.success
        assert [r.run_id for r in await rt.store.list_runs(thread_id=thread)] == [run.run_id]
        # Identity keys in the caller's context are dropped; the rest is kept on the record.
        assert run.kwargs["context"] == {"note": 1}


async def test_a_run_whose_summary_model_is_unusable_is_refused_naming_the_key(
    keel: Keel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction on, its model a provider model without its key: the run could never compact,
    so it is refused like a run on an unusable model, not admitted to fail later."""
    monkeypatch.delenv("KEEL_TEST_SUMMARY_KEY", raising=False)
    base = keel.config().model_dump()
    summarizer = {"name": "summarizer", "use": "openai:gpt-4.1-mini", "api_key_env": "KEEL_TEST_SUMMARY_KEY"}
    limits = {**base["limits"], "summarization": {"enabled": True, "trigger_messages": 30, "model": "summarizer"}}
    config = type(keel.config())(**{**base, "models": [*base["models"], summarizer], "limits": limits})
    async with keel.open(config) as rt:
        thread = new_thread_id("summary-model")
        with pytest.raises(RequestError) as caught:
            await rt.manager.create(RunRequest(thread_id=thread, input="hello"))
        assert caught.value.field == "limits.summarization.model"
        assert "KEEL_TEST_SUMMARY_KEY" in str(caught.value)
        await _nothing_stored(rt, thread)
