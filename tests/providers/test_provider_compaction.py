"""A long run with compaction through the real provider packages, against the strict stubs.

The scripted model's strict check is ours; the stubs validate as the providers do, and what
reaches them went through ``langchain-openai`` / ``langchain-anthropic``'s own message conversion.
So a 100-turn run that compacts 23 times must send only requests the stub accepts — the
lead's projected requests (one system prompt, the data message, the kept tail with whole tool
batches) and the summary calls alike. The summary calls come whenever compaction triggers; a
``match`` step (keyed on the summary instructions) answers them wherever they fall, while the
lead's 100 turns play in order.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from provider_support import STUB_KEY_ENV, StubServer

from agentkeel.config import KeelConfig
from agentkeel.harness.middleware.summarization import CALLER, INSTRUCTIONS
from agentkeel.runtime.checkpoints import StateAccessor
from agentkeel.runtime.checkpoints import mode as mode_module
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import open_runtime

# langchain-openai caches one httpx client per base URL, bound to the loop that opened it.
pytestmark = pytest.mark.asyncio(loop_scope="session")

# A small window compacts about as often as a long run at a larger one would (23 times; 300 turns
# at 40/20 compacted 28 times) in a third of the turns, which are what the test spends its time on.
TURNS = 100
TRIGGER, KEEP = 16, 8
LIFTED = 1_000_000
SUMMARY = "Summary so far: one note per step is being written into /workspace/notes; all were confirmed."
USES = {"openai": "openai:gpt-4.1-mini", "anthropic": "anthropic:claude-sonnet-4-5"}


def note_step(i: int) -> dict[str, Any]:
    path = f"/workspace/notes/{i}.md"
    return {"text": f"Step {i}: writing a note.", "usage": {"input": 900, "output": 30},
            "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": f"Note {i}: the figures hold.\n"}}]}


def config(tmp_path: Path, stub: StubServer, provider: str) -> KeelConfig:
    return KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://", stream="memory",
        models=[{"name": "m", "use": USES[provider], "api_key_env": STUB_KEY_ENV, "base_url": stub.base_url,
                 "timeout_s": 10}],
        limits={
            "summarization": {"enabled": True, "trigger_messages": TRIGGER, "keep_messages": KEEP},
            "turn_limit": {"max_turns": TURNS + 10},
            "loop_detection": {"tool_freq_warn": LIFTED, "tool_freq_hard_limit": LIFTED},
            "token_budget": {"max_tokens": 100_000_000},
            "recursion_limit": 5 * TURNS + 20, "max_recursion_limit": 5 * TURNS + 20,
        },
        base_dir=tmp_path,
    )


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body.get("messages") or [])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_long_run_with_compaction_sends_only_requests_a_strict_provider_accepts(
    request: pytest.FixtureRequest, stub_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str,
) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    stub: StubServer = request.getfixturevalue(f"{provider}_stub")
    stub.script(
        {"match": INSTRUCTIONS[:60], "text": SUMMARY, "repeat": True, "usage": {"input": 700, "output": 40}},
        *(note_step(i) for i in range(1, TURNS + 1)),
        {"text": f"Done: {TURNS} notes written."},
    )
    thread = f"long-{uuid.uuid4().hex[:8]}"
    async with open_runtime(config(tmp_path, stub, provider)) as rt:
        record = await rt.manager.create(RunRequest(thread_id=thread, input="Write one note per step."))
        async with asyncio.timeout(600):
            done = await rt.manager.wait(record.run_id)
        assert done is not None
        events = await rt.journal.list(done.run_id)
        graph = await rt.harness.state_graph(rt.harness.resolve("lead"), {"metadata": {}})
        snapshot = await StateAccessor(graph, rt.checkpointer).aget(thread)
    assert done.status is RunStatus.success, done.error

    received = stub.requests()
    assert [r for r in received if r["violations"]] == []  # every request valid for the strict stub
    # ... as built: the grammar's repair layer (on for provider models) had nothing to repair, and
    # no summary call failed open.
    interventions = [e.data for e in events if e.kind == "intervention"]
    assert [d for d in interventions if d.get("action") in ("repair", "fail_open")] == []
    assert all(r["answered"]["status"] == 200 for r in received)
    summaries = [r for r in received if r["step"].get("match")]
    lead = [r for r in received if not r["step"].get("match")]
    assert len(lead) == TURNS + 1
    assert len(summaries) >= (2 * TURNS - TRIGGER) // (TRIGGER - KEEP)
    # Every summary request is the instructions and the data; it never carries the lead's tools.
    assert all(INSTRUCTIONS in json.dumps(r["body"]) and not r["body"].get("tools") for r in summaries)

    # What the provider was sent stays bounded: the trigger's messages at most (Anthropic's
    # system prompt is a field of its own, OpenAI's the first message), whole tool batches.
    sizes = [len(messages_of(r["body"])) for r in lead]
    assert max(sizes) <= TRIGGER + 1, max(sizes)
    body_chars = [len(json.dumps(messages_of(r["body"]))) for r in lead]
    assert max(body_chars) <= 1.25 * max(body_chars[: TURNS // 5]), (max(body_chars), max(body_chars[: TURNS // 5]))
    assert SUMMARY in json.dumps(lead[-1]["body"])  # the latest summary reached the last request

    # The thread and the journal hold everything the run did.
    assert snapshot is not None and len(snapshot.values["messages"]) == 2 * TURNS + 2
    calls = [e for e in events if e.kind == "model.call"]
    assert sum(1 for e in calls if e.caller == "lead") == TURNS + 1
    assert sum(1 for e in calls if e.caller == CALLER) == len(summaries)
