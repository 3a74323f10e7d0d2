"""DeerFlow #3875 replayed through the real runtime: three children, each repeating one
``write_file`` forever, on the scripted model and on the OpenAI-compatible stub over HTTP.

What must hold: every child is stopped by the loop guard within ``hard_limit`` tool-calling turns
plus one forced final answer; the lead gets each outcome as data and answers; the run's stop
reasons name each child; and the run's tokens stay within the bound the script implies. With
drifting arguments the loop guard (rightly) never fires and the token budget stops the child.
"""

from __future__ import annotations

import hashlib
from typing import Any

from langchain_core.messages import ToolMessage
from provider_support import STUB_KEY_ENV, StubServer
from runtime_support import Keel, finished, journal, run_to_end, start, thread_messages
from subagent_support import (
    CHILD_USAGE,
    GP,
    LEAD_ANSWER,
    LEAD_USAGE,
    TOPICS,
    ends_by_task,
    last_answer,
    ledger,
    of_kind,
    outcome_of,
    replay_script,
    sentence_prompt,
    task_results,
    tokens,
)

from agentkeel.config import KeelConfig
from agentkeel.limits import LoopDetectionLimits
from agentkeel.runtime.records import RunRecord, RunStatus

HARD = LoopDetectionLimits().hard_limit
CHILD_CALLS = HARD + 1  # hard_limit tool-calling turns, the last withheld, then one forced final answer


def check_capped_children(record: RunRecord, results: dict[str, ToolMessage], ends: dict[str, dict[str, Any]]) -> None:
    """Each child ended ``completed`` + ``loop_capped`` within its call bound, and said so as data."""
    assert record.status == RunStatus.success, record.error
    assert len(results) == len(TOPICS) and set(ends) == set(results)
    run_reasons = {(r["code"], r["source"]) for r in record.stop_reasons}
    for task_id, message in results.items():
        data = outcome_of(message)
        assert (data["status"], data["stop_reason"], data["subagent_type"]) == ("completed", "loop_capped", GP)
        assert [r["code"] for r in data["stop_reasons"]] == ["loop_capped"]
        assert 1 <= data["usage"]["calls"] <= CHILD_CALLS and data["turns"] <= CHILD_CALLS
        # The brief is the child's whole (short) answer; the digest lets a reader check it.
        assert data["brief"] and data["sha256"] == hashlib.sha256(data["brief"].encode()).hexdigest()
        assert "capped: repeated tool-call loop" in message.text
        assert ends[task_id]["status"] == "completed" and ends[task_id]["sha256"] == data["sha256"]
        assert ("loop_capped", f"subagent:{GP}/{task_id}") in run_reasons


async def test_three_runaway_children_are_each_loop_capped_and_the_lead_answers(keel: Keel) -> None:
    config = keel.config({"replay": replay_script()})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, "t-3875", "Write three sentences, one per subagent.")
        events = await journal(rt, record.run_id)
        messages = await thread_messages(rt, "t-3875")
        results = task_results(messages)
        check_capped_children(record, results, ends_by_task(events))
        assert last_answer(messages) == LEAD_ANSWER
        assert rt.harness.subagent_capacity.running == 0
        entries = await ledger(rt, "t-3875")
    for task_id, message in results.items():
        data, entry = outcome_of(message), entries[task_id]
        assert (entry["status"], entry["stop_reason"]) == ("completed", "loop_capped")
        assert (entry["result_brief"], entry["result_sha256"]) == (data["brief"], data["sha256"])

    child_calls = [e for e in of_kind(events, "model.call") if e.caller == f"subagent:{GP}"]
    assert len(child_calls) <= len(TOPICS) * CHILD_CALLS
    # The bound, from the script: the lead's two turns plus every child's capped turns.
    bound = sum(tokens(u) for u in LEAD_USAGE) + len(TOPICS) * CHILD_CALLS * tokens(CHILD_USAGE)
    assert record.usage["total_tokens"] <= bound
    # And the per-task usage the outcomes report adds up to what the run counted for its children.
    assert sum(outcome_of(m)["usage"]["total_tokens"] for m in results.values()) == \
        record.usage["by_agent"][f"subagent:{GP}"]["total_tokens"]


async def test_drifting_arguments_escape_the_loop_guard_and_hit_the_token_budget(keel: Keel) -> None:
    # Each turn writes different content: no two call sets hash alike, and 50 calls of one tool
    # (the frequency layer) is far beyond what this budget allows.
    budget = 30 * tokens(CHILD_USAGE)
    config = keel.config({"replay": replay_script("Sentence, draft {turn}.\n")},
                         limits={"token_budget": {"max_tokens": budget}, "read_before_write": {"enabled": False}})
    async with keel.open(config) as rt:
        record = await run_to_end(rt, "t-drift", "Write three sentences, one per subagent.")
        messages = await thread_messages(rt, "t-drift")
    outcomes = [outcome_of(m) for m in task_results(messages).values()]
    assert len(outcomes) == len(TOPICS)
    for data in outcomes:
        codes = [r["code"] for r in data["stop_reasons"]]
        assert "loop_capped" not in codes and data["stop_reason"] == "token_capped", data
        assert data["status"] == "completed"
    # Together they went past where identical calls would have been stopped.
    assert sum(d["usage"]["calls"] for d in outcomes) > len(TOPICS) * CHILD_CALLS
    assert "token_capped" in {r["code"] for r in record.stop_reasons}
    assert last_answer(messages) == LEAD_ANSWER
    # The budget is the run's, children included. Past it, each child makes at most the call that
    # crossed it (withheld) and one forced final answer; then the lead answers.
    overshoot = len(TOPICS) * 2 * tokens(CHILD_USAGE) + tokens(LEAD_USAGE[1])
    assert budget <= record.usage["total_tokens"] <= budget + overshoot


async def test_the_replay_over_http_with_langchain_openai(keel: Keel, openai_stub: StubServer, stub_key: str) -> None:
    """The same replay, the model being ``langchain-openai`` against the stub: steps are served by
    ``match`` (children run concurrently, so their requests interleave)."""
    lead_final = {"match": "Task completed", "text": LEAD_ANSWER, "usage": dict(zip(("input", "output"), LEAD_USAGE[1]))}
    children = [
        {"match": f"about {topic}", "repeat": True, "usage": dict(zip(("input", "output"), CHILD_USAGE)),
         "tool_calls": [{"name": "write_file", "arguments": {"path": f"/workspace/outputs/{topic}.md",
                                                             "content": "A sentence.\n"}}]}
        for topic in TOPICS
    ]
    lead_first = {"text": "Delegating one sentence each.", "usage": dict(zip(("input", "output"), LEAD_USAGE[0])),
                  "tool_calls": [{"name": "task", "arguments": {"description": f"Sentence about {t}",
                                                                "prompt": sentence_prompt(t), "subagent_type": GP}}
                                 for t in TOPICS]}
    openai_stub.script(lead_first, lead_final, *children)
    model = {"name": "gpt", "use": "openai:gpt-4.1-mini", "base_url": openai_stub.base_url,
             "api_key_env": STUB_KEY_ENV, "timeout_s": 10}
    raw: dict[str, Any] = {"data_dir": str(keel.tmp_path / "data"), "database": "memory://", "models": [model]}
    config = KeelConfig(**raw, base_dir=keel.tmp_path)
    async with keel.open(config) as rt:
        run = await start(rt, "t-3875-http", "Write three sentences, one per subagent.")
        record = await finished(rt, run.run_id, timeout=60)
        events = await journal(rt, record.run_id)
        messages = await thread_messages(rt, "t-3875-http")
    check_capped_children(record, task_results(messages), ends_by_task(events))
    assert last_answer(messages) == LEAD_ANSWER
    assert openai_stub.violations() == []  # every request kept the provider's grammar
    child_requests = [b for b in openai_stub.bodies() if "You are a subagent" in str(b.get("messages"))]
    assert len(child_requests) <= len(TOPICS) * CHILD_CALLS
    bound = sum(tokens(u) for u in LEAD_USAGE) + len(TOPICS) * CHILD_CALLS * tokens(CHILD_USAGE)
    assert record.usage["total_tokens"] <= bound
