"""Model failures and missing usage through the whole runtime: the run record says why a failed run
failed (``error_detail``, on every database), the journal says what each failed attempt was, and a
provider that reports no usage is counted by estimate so the token budget still binds."""

from __future__ import annotations

from typing import Any

from runtime_support import DATABASE_MATRIX, backend_matrix, call, journal, new_thread_id, run_to_end, stored, turn

from agentkeel.runtime.ledger import build_ledger
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(DATABASE_MATRIX)

FAST_RETRY = {"llm_retry": {"max_attempts": 2, "base_delay_ms": 0, "max_delay_ms": 0}}


def _raise(kind: str, **extra: Any) -> dict[str, Any]:
    return {"raise": {"kind": kind, "message": f"scripted {kind}"}, **extra}


async def test_a_refused_request_fails_the_run_with_its_detail(keel) -> None:
    config = keel.config({"picky": [_raise("bad_request")]}, limits=FAST_RETRY)
    async with keel.open(config) as rt:
        record = await run_to_end(rt, new_thread_id())
        events = await journal(rt, record.run_id)
        kept = await stored(rt, record.run_id)
        ledger = await build_ledger(kept, rt.journal)

    assert record.status is RunStatus.error
    assert record.error == ("ModelCallFailed: model call refused after 1 attempt (invalid_request, HTTP 400) "
                            "— model 'picky' (scripted): ScriptedBadRequestError: scripted bad_request")
    expected = {
        "type": "ScriptedBadRequestError", "message": "scripted bad_request", "kind": "invalid_request",
        "status": 400, "code": None, "attempts": 1, "model": "picky", "use": "scripted", "key_env": None,
    }
    assert kept.error_detail == expected and kept.to_dict()["error_detail"] == expected
    assert ledger["error_detail"] == expected and not ledger["clean"]
    (error,) = [e.data for e in events if e.kind == "model.error"]
    assert (error["error_type"], error["kind"], error["status"]) == ("ScriptedBadRequestError", "invalid_request", 400)
    assert [e.data["detail"] for e in events if e.kind == "error"] == [expected]


async def test_exhausted_retries_are_each_journaled_with_their_status(keel) -> None:
    config = keel.config({"busy": [_raise("rate_limit", repeat="forever")]}, limits=FAST_RETRY)
    async with keel.open(config) as rt:
        record = await run_to_end(rt, new_thread_id())
        events = await journal(rt, record.run_id)

    assert record.status is RunStatus.error
    assert record.error_detail is not None
    assert (record.error_detail["kind"], record.error_detail["attempts"]) == ("rate_limit", 2)
    assert [(e.data["kind"], e.data["status"]) for e in events if e.kind == "model.error"] == [
        ("rate_limit", 429), ("rate_limit", 429)]
    (retry,) = [e.data for e in events if e.kind == "intervention" and e.data["action"] == "retry"]
    assert (retry["attempt"], retry["status"], retry["reason"], retry["model"]) == (1, 429, "rate_limit", "busy")


async def test_a_successful_run_has_no_error_detail(keel) -> None:
    async with keel.open() as rt:
        record = await run_to_end(rt, new_thread_id())
    assert record.status is RunStatus.success and record.error_detail is None


async def test_usage_a_provider_does_not_report_is_estimated_and_binds_the_budget(keel) -> None:
    # Every turn writes a new 2,000-character file and reports zero tokens on both sides.
    writing = turn("Writing part {turn}.", call("write_file", path="/workspace/out/{turn}.txt", content="x" * 2000),
                   usage=(0, 0), repeat="forever")
    config = keel.config({"silent": [writing]}, limits={"token_budget": {"max_tokens": 3000}})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, new_thread_id())
        events = await journal(rt, record.run_id)

    calls = [e.data for e in events if e.kind == "model.call"]
    assert calls and all(c["estimated"] for c in calls)
    # About four characters per token: the 2,000-character argument alone is ~500 output tokens.
    assert all(c["output_tokens"] >= 500 for c in calls[:-1])
    assert all(c["input_tokens"] > 0 for c in calls)
    assert record.usage["total_tokens"] == sum(c["input_tokens"] + c["output_tokens"] for c in calls)
    assert record.status is RunStatus.success and record.stop_reason == "token_capped"
    assert len(calls) < 10  # the budget stopped it, not the turn limit
