"""The server's secrets never leave in what a run leaves behind.

A provider that rejects a key may quote it back. Here the OpenAI stub does, through the real
``langchain-openai`` package, and the key must then be absent from the run record (error, error
detail, stop reasons), every journal event, every stream event and every log line, while the
record still says what went wrong and which variable to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from provider_support import STUB_KEY_ENV, StubServer

from agentkeel.config import KeelConfig
from agentkeel.runtime import redaction
from agentkeel.runtime.observe import observe
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import open_runtime


@pytest.mark.asyncio(loop_scope="session")  # langchain-openai's cached client is bound to the session loop
async def test_a_key_the_provider_quotes_back_is_redacted_everywhere(
    openai_stub: StubServer, stub_key: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    openai_stub.script({"error": {"status": 401, "type": "invalid_request_error", "code": "invalid_api_key",
                                  "message": f"Incorrect API key provided: {stub_key}. Check it."}, "repeat": True})
    config = KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://", stream="memory",
        models=[{"name": "m", "use": "openai:gpt-4.1-mini", "api_key_env": STUB_KEY_ENV,
                 "base_url": openai_stub.base_url}],
        base_dir=tmp_path,
    )
    caplog.set_level(logging.DEBUG)
    try:
        async with open_runtime(config) as rt:
            record = await rt.manager.create(RunRequest(thread_id=f"t-{uuid.uuid4().hex[:8]}", input="hello"))
            async with asyncio.timeout(30):
                done = await rt.manager.wait(record.run_id)
                events: list[Any] = []
                async with contextlib.aclosing(observe(rt, record.run_id, last_event_id="-1")) as stream:  # type: ignore[type-var]
                    async for item in stream:
                        events.append(item)
            journal = await rt.journal.list(record.run_id)
            logging.getLogger("agentkeel.test").error("the provider said %s", f"key {stub_key} refused")
    finally:
        redaction.install()  # back to this process's environment only
    assert done is not None and done.status is RunStatus.error
    assert done.error_detail is not None and done.error_detail["kind"] == "auth"
    assert done.error is not None and f"[redacted:{STUB_KEY_ENV}]" in done.error
    assert STUB_KEY_ENV in done.error  # still says which variable to check
    leaks = {
        "record": json.dumps(done.as_dict() if hasattr(done, "as_dict") else done.__dict__, default=str),
        "journal": json.dumps([e.data for e in journal], default=str),
        "stream": json.dumps([getattr(e, "data", None) for e in events], default=str),
        "logs": "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records),
    }
    assert {where: stub_key in text for where, text in leaks.items()} == dict.fromkeys(leaks, False)
    assert any(e.kind == "model.error" for e in journal)
    assert "[redacted:" in leaks["logs"]


def test_which_values_count_as_secrets() -> None:
    env = {"OPENAI_API_KEY": "sk-1234567890", "MY_TOKEN": "tok-abcdefgh", "DB_PASSWORD": "hunter2hunter2",
           "SHORT_KEY": "abc", "PATH": "/usr/bin:/bin", "CUSTOM": "custom-secret-value", "KEYBOARD": "us-layout-x"}
    found = redaction.secrets_in(env, names=["CUSTOM"])
    assert set(found) == {"OPENAI_API_KEY", "MY_TOKEN", "DB_PASSWORD", "SHORT_KEY", "CUSTOM"}
    redact = redaction.Redactor(found)
    assert redact("a sk-1234567890 b custom-secret-value abc") == (
        "a [redacted:OPENAI_API_KEY] b [redacted:CUSTOM] abc")  # too short to be treated as one
    assert redact.names == ["CUSTOM", "DB_PASSWORD", "MY_TOKEN", "OPENAI_API_KEY"]
