"""AgentKeel configured with provider models pointed at the stubs: the config, ``keel run`` as a
subprocess and ``keel serve`` as a real server process (``tests/gateway/server_support``).

One config serves every end-to-end test: the first model (``nokey``, the ``lead`` assistant's
default) has no key in the environment, so a thread's state is read with an unusable default model;
the tests pick a working model per run (``--model`` / ``context.model_name``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from provider_support import STUB_KEY, STUB_KEY_ENV, StubServer

sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))

from server_support import KeelServer, collect, sdk, start_server  # noqa: E402

UNSET_KEY_ENV = "AGENTKEEL_TEST_UNSET_KEY"
OPENAI_MODEL = "gpt-4.1-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
# Small enough to bind in a few calls of the stubs' scripted usage, and the retries fast.
LIMITS: dict[str, Any] = {
    "token_budget": {"max_tokens": 1000},
    "llm_retry": {"max_attempts": 3, "base_delay_ms": 50, "max_delay_ms": 100, "max_retry_after_ms": 400},
    "run_timeout_s": 60,
    "stream_heartbeat_s": 1,
}


def write_config(root: Path, openai: StubServer, anthropic: StubServer, **extra: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    stub = {"api_key_env": STUB_KEY_ENV}
    config = {
        "data_dir": str(root / "data"),
        "database": f"sqlite:///{root / 'keel.db'}",
        "models": [
            {"name": "nokey", "use": f"openai:{OPENAI_MODEL}", "api_key_env": UNSET_KEY_ENV, "base_url": openai.base_url},
            {"name": "gpt", "use": f"openai:{OPENAI_MODEL}", "base_url": openai.base_url, "timeout_s": 2,
             "options": {"top_p": 0.9}, **stub},
            {"name": "claude", "use": f"anthropic:{ANTHROPIC_MODEL}", "base_url": anthropic.base_url, "timeout_s": 2,
             **stub},
            {"name": "bogus", "use": "nosuchprovider:some-model", **stub},
        ],
        "limits": LIMITS,
        "gateway": {"heartbeat_s": 1, "drain_s": 2},
        **extra,
    }
    path = root / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def workspace(config: Path, thread_id: str) -> Path:
    return config.parent / "data" / "threads" / thread_id / "workspace"


def keel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``keel ARGS`` in a subprocess with the stub key set and no AGENTKEEL_* overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTKEEL_")}
    env.update({"COLUMNS": "160", "NO_COLOR": "1", STUB_KEY_ENV: STUB_KEY})
    return subprocess.run([sys.executable, "-m", "agentkeel.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def keel_run(config: Path, prompt: str, model: str, *more: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``keel run PROMPT --model MODEL --json``: the process and its ledger ({} when none printed)."""
    result = keel("run", prompt, "--config", str(config), "--model", model, "--json", *more, cwd=config.parent)
    start = result.stdout.find("{")
    ledger = json.loads(result.stdout[start:]) if start >= 0 else {}
    return result, ledger


def start_keel(config: Path) -> KeelServer:
    """``keel serve`` on ``config`` with the stub key in its environment (and the unset one unset)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STUB_KEY_ENV, STUB_KEY)
        patch.delenv(UNSET_KEY_ENV, raising=False)
        return start_server(config)


@pytest.fixture(scope="session")
def keel_provider_server(tmp_path_factory: pytest.TempPathFactory, openai_stub_process: StubServer,
                         anthropic_stub_process: StubServer) -> Iterator[KeelServer]:
    """One ``keel serve`` on the provider config, shared by the session (a start costs 5-10 s)."""
    server = start_keel(write_config(tmp_path_factory.mktemp("keel-providers"), openai_stub_process,
                                     anthropic_stub_process))
    yield server
    server.stop()


def write_call(path: str, content: str, call_id: str | None = None) -> dict[str, Any]:
    """A scripted ``write_file`` tool call (arguments JSON-encoded by the stub)."""
    call: dict[str, Any] = {"name": "write_file", "arguments": {"path": path, "content": content}}
    if call_id:
        call["id"] = call_id
    return call


def tool_task(stub: StubServer, path: str = "/workspace/outputs/note.md") -> dict[str, int]:
    """Script a two-turn tool-using task (write a file, then answer); the usage it will report."""
    stub.script(
        {"text": "Writing the note.", "tool_calls": [write_call(path, "hello from a provider\n")],
         "usage": {"input": 123, "output": 45}},
        {"text": f"Done: the note is at {path}.", "usage": {"input": 210, "output": 17}},
    )
    return {"input": 333, "output": 62}


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body.get("messages") or [])


def tool_results(body: dict[str, Any]) -> list[str]:
    """The text of every tool result in a request, OpenAI or Anthropic shaped."""
    found = []
    for message in messages_of(body):
        if message.get("role") == "tool":
            found.append(json.dumps(message.get("content")))
        content = message.get("content")
        if isinstance(content, list):
            found += [json.dumps(block.get("content")) for block in content
                      if isinstance(block, dict) and block.get("type") == "tool_result"]
    return found


def first_user_message(body: dict[str, Any]) -> str:
    """The first user message of a request, serialised exactly as sent."""
    return json.dumps(next(m for m in messages_of(body) if m.get("role") == "user"))


# -- keel serve, through the official SDK -------------------------------------------------------------
PROMPT = {"messages": [{"role": "user", "content": "Write the note, please."}]}


async def run_streamed(server: KeelServer, model: str, *, thread_id: str | None = None,
                       modes: tuple[str, ...] = ("messages-tuple", "values"),
                       prompt: dict[str, Any] = PROMPT) -> tuple[dict[str, Any], list[Any]]:
    """One run of ``lead`` on ``model`` streamed to its end: the final run resource and the parts."""
    async with sdk(server.url) as client:
        if thread_id is None:
            thread_id = (await client.threads.create())["thread_id"]
        parts = await collect(client.runs.stream(thread_id, "lead", input=prompt, stream_mode=list(modes),
                                                 context={"model_name": model}), timeout=45)
        metadata = next(p.data for p in parts if p.event == "metadata")
        run = await client.runs.get(thread_id, metadata["run_id"])
        return run, parts


async def journal(server: KeelServer, run: dict[str, Any], kind: str | None = None) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.get(f"/threads/{run['thread_id']}/runs/{run['run_id']}/journal",
                                  params={"kind": kind} if kind else None)
        response.raise_for_status()
        return list(response.json())


def retries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["kind"] == "intervention" and e["data"].get("action") == "retry"]
