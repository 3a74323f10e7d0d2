"""Tool calls as real providers send them, through ``keel serve``: arguments that are not valid JSON
(a missing closing brace; a string cut off with ``finish_reason: tool_calls``, which LangChain's
partial-JSON parser would "repair") are never executed and the model is told why; a file changed by
several tool calls lists each of them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from keel_support import run_streamed, tool_results, workspace
from provider_support import StubServer
from server_support import KeelServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

BROKEN = {
    # valid JSON up to its end, but the object is never closed
    "unclosed": '{"path": "/workspace/outputs/broken.md", "content": "all of it"',
    # cut off mid-string: the partial-JSON parser would complete it as {"content": "half of the con"}
    "truncated": '{"path": "/workspace/outputs/broken.md", "content": "half of the con',
}


@pytest.mark.parametrize("model", ["gpt", "claude"])
@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_malformed_tool_call_arguments_write_nothing_and_the_model_is_told(
        keel_provider_server: KeelServer, request: pytest.FixtureRequest, model: str, case: str) -> None:
    stub: StubServer = request.getfixturevalue("openai_stub" if model == "gpt" else "anthropic_stub")
    finish = "tool_calls" if model == "gpt" else "tool_use"
    stub.script(
        {"tool_calls": [{"name": "write_file", "arguments": BROKEN[case], "id": "call_broken"}], "finish": finish},
        {"text": "The arguments were malformed; I will stop here."},
    )
    run, _ = await run_streamed(keel_provider_server, model)
    assert run["status"] == "success", run
    assert not (workspace(keel_provider_server.config, run["thread_id"]) / "outputs" / "broken.md").exists()
    bodies = stub.bodies()
    assert len(bodies) == 2, "a response with only invalid tool calls was taken as the final answer"
    told = tool_results(bodies[1])
    said = told[-1].lower() if told else ""
    assert "not valid json" in said or "malformed" in said, told
    assert "line 1 column" in said, told  # the parse error itself
    assert stub.violations() == []


async def test_a_file_changed_by_several_tool_calls_lists_each_of_them(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    path = "/workspace/outputs/twice.md"
    calls: list[dict[str, Any]] = [
        {"name": "write_file", "arguments": {"path": path, "content": "alpha\n"}, "id": "call_write"},
        {"name": "read_file", "arguments": {"path": path}, "id": "call_read"},  # the read-before-write gate
        {"name": "str_replace", "arguments": {"path": path, "old": "alpha", "new": "beta"}, "id": "call_edit"},
    ]
    openai_stub.script(*({"tool_calls": [call]} for call in calls), {"text": "Done."})
    run, _ = await run_streamed(keel_provider_server, "gpt")
    assert run["status"] == "success", run
    assert (workspace(keel_provider_server.config, run["thread_id"]) / "outputs" / "twice.md").read_text() == "beta\n", \
        tool_results(openai_stub.bodies()[-1])
    async with httpx.AsyncClient(base_url=keel_provider_server.url) as http:
        changes = (await http.get(f"/threads/{run['thread_id']}/runs/{run['run_id']}/changes")).json()
    [change] = [c for c in changes if c["path"] == path]
    assert [step["tool_call_id"] for step in change["steps"]] == ["call_write", "call_edit"], change
    assert change["steps"][0]["after_sha256"] == change["steps"][1]["before_sha256"] != change["after_sha256"]
