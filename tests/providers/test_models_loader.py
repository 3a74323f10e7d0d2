"""Provider models built by AgentKeel's loader (not by hand), against the stub servers over HTTP:
streamed usage is reported from an OpenAI-compatible ``base_url`` without any setting, the SDK never
retries on its own, and ``timeout_s`` bounds one request."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import openai
import pytest
from langchain_core.messages import AIMessageChunk
from provider_support import STUB_KEY_ENV, StubServer

from agentkeel.config import BUNDLED_SCRIPTS, KeelConfig
from agentkeel.harness.models import ModelLoader

# langchain-openai caches one httpx client per base URL across model instances, bound to the loop
# that opened it: these tests share the session's loop (as the stub tests do).
pytestmark = pytest.mark.asyncio(loop_scope="session")


def build(stub: StubServer, use: str, **model: Any) -> Any:
    config = KeelConfig(models=[
        {"name": "demo", "use": "scripted", "script": str(BUNDLED_SCRIPTS / "demo.yaml")},
        {"name": "m", "use": use, "api_key_env": STUB_KEY_ENV, "base_url": stub.base_url, **model},
    ])
    loader = ModelLoader(config)
    assert loader.problems == {}
    return loader.build("m")


async def streamed(model: Any) -> AIMessageChunk:
    total: AIMessageChunk | None = None
    async for chunk in model.astream("hi"):
        total = chunk if total is None else total + chunk
    assert total is not None
    return total


async def test_a_streamed_openai_compatible_model_on_a_base_url_reports_the_providers_usage(
    openai_stub: StubServer, stub_key: str,
) -> None:
    openai_stub.script({"text": "one two three", "chunks": 3, "usage": {"input": 1234, "output": 56}})
    total = await streamed(build(openai_stub, "openai:qwen2.5-7b-instruct"))
    assert total.content == "one two three"
    assert total.usage_metadata is not None
    assert (total.usage_metadata["input_tokens"], total.usage_metadata["output_tokens"]) == (1234, 56)
    [body] = openai_stub.bodies()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert openai_stub.violations() == []


async def test_a_streamed_anthropic_model_reports_the_providers_usage(anthropic_stub: StubServer, stub_key: str) -> None:
    anthropic_stub.script({"text": "Bonjour", "usage": {"input": 321, "output": 9}})
    total = await streamed(build(anthropic_stub, "anthropic:claude-sonnet-4-5"))
    assert total.usage_metadata is not None
    assert (total.usage_metadata["input_tokens"], total.usage_metadata["output_tokens"]) == (321, 9)
    assert anthropic_stub.violations() == []


@pytest.mark.parametrize(("use", "error"), [
    ("openai:gpt-4.1-mini", openai.RateLimitError),
    ("anthropic:claude-sonnet-4-5", anthropic.RateLimitError),
])
async def test_the_provider_client_makes_exactly_one_request_per_call(
    request: pytest.FixtureRequest, stub_key: str, use: str, error: type[Exception],
) -> None:
    stub: StubServer = request.getfixturevalue("openai_stub" if use.startswith("openai") else "anthropic_stub")
    stub.script({"error": "rate_limit", "retry_after": 0, "repeat": True})
    with pytest.raises(error):
        await build(stub, use).ainvoke("hi")
    assert len(stub.requests()) == 1  # the SDK's default would have been 3 (max_retries=2)


async def test_timeout_s_bounds_one_request(openai_stub: StubServer, stub_key: str) -> None:
    openai_stub.script({"delay_s": 5})
    model = build(openai_stub, "openai:gpt-4.1-mini", timeout_s=0.5)
    began = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await model.ainvoke("hi")
    assert time.monotonic() - began < 3
    assert len(openai_stub.requests()) == 1
