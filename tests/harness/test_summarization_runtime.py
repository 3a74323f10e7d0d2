"""Summarization through the product: the config (start-up errors naming the key), the harness
binding the summary model, and a real run through the worker — journal, usage and thread state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from langchain_openai import ChatOpenAI

from agentkeel.config import ConfigError, KeelConfig, load_config
from agentkeel.harness.agents import Harness
from agentkeel.harness.middleware.summarization import Summarization
from agentkeel.harness.scripted import ScriptedChatModel
from agentkeel.runtime.checkpoints import StateAccessor
from agentkeel.runtime.checkpoints import mode as mode_module
from agentkeel.runtime.records import RunStatus
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import open_runtime

LS = {"name": "ls", "args": {"path": "/workspace"}}
SUMMARIZE = {"enabled": True, "trigger_messages": 4, "keep_messages": 2}


def _script(tmp_path: Path, name: str, agents: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"agents": agents}))
    return str(path)


def _config(
    tmp_path: Path, models: dict[str, dict[str, Any]], summarization: dict[str, Any],
    providers: tuple[dict[str, Any], ...] = (), **extra: Any,
) -> KeelConfig:
    """Scripted ``models`` (name -> the script's agents) and ``providers`` (model definitions)."""
    return KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://",
        models=[*({"name": n, "use": "scripted", "script": _script(tmp_path, n, a)} for n, a in models.items()),
                *providers],
        assistants=[{"assistant_id": "lead"}],
        limits={"summarization": summarization, "stream_heartbeat_s": 0.2}, base_dir=tmp_path, **extra,
    )


LEAD = [*({"say": f"step {i}", "tool_calls": [LS], "usage": {"input": 10, "output": 2}} for i in range(3)),
        {"say": "All done."}]


@pytest.mark.parametrize("checkpoint_mode", ["full", "delta"])
async def test_a_run_compacts_through_the_worker_with_the_scripts_summarization_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint_mode: str,
) -> None:
    monkeypatch.setattr(mode_module, "_frozen", None)
    summaries = [{"say": "RUN-SUMMARY-1", "usage": {"input": 700, "output": 30}, "expect": {"contains": "<new_messages>"}},
                 {"say": "RUN-SUMMARY-2", "expect": {"contains": "RUN-SUMMARY-1"}}]
    config = _config(tmp_path, {"demo": {"lead": LEAD, "summarization": summaries}}, SUMMARIZE,
                     checkpoint_mode=checkpoint_mode)
    async with open_runtime(config) as rt:
        record = await rt.manager.create(RunRequest(thread_id="t-summary", input="Go."))
        done = await rt.manager.wait(record.run_id)
        events = await rt.journal.list(record.run_id)
        graph = await rt.harness.state_graph(rt.harness.resolve("lead"), {"metadata": {}})
        snapshot = await StateAccessor(graph, rt.checkpointer).aget("t-summary")

    assert done is not None and done.status is RunStatus.success, done
    calls = [e for e in events if e.kind == "model.call" and e.caller == "middleware:summarization"]
    assert [e.data["input_tokens"] for e in calls][:1] == [700] and len(calls) == 2
    assert done.usage["by_agent"]["middleware:summarization"]["calls"] == 2
    assert done.usage["by_caller"]["middleware"]["input_tokens"] >= 700
    compactions = [e for e in events if e.kind == "compaction"]
    assert [(e.data["from"], e.data["to"]) for e in compactions] == [(0, 3), (3, 5)]
    assert snapshot is not None
    values = snapshot.values
    assert len(values["messages"]) == 8  # the thread keeps every message
    assert values["compaction"]["summary"] == "RUN-SUMMARY-2" and values["compaction"]["model"] == "demo"


async def test_the_harness_binds_the_run_models_twin_or_a_fresh_named_model(tmp_path: Path) -> None:
    models = {"demo": {"lead": LEAD}, "small": {"summarization": [{"say": "small"}]}}
    for named, expected in ((None, "demo"), ("small", "small")):
        harness = Harness(_config(tmp_path, models, {**SUMMARIZE, "model": named}))
        resolved = harness.resolve("lead")
        chain = harness.chain(resolved)
        await harness.build(resolved, {"metadata": {"run_id": "run-12345678"}}, chain)
        (member,) = [m for m in chain.middlewares if isinstance(m, Summarization)]
        model = member._model
        assert isinstance(model, ScriptedChatModel) and model.agent == "summarization"
        assert model.model_name == expected and member._model_name == expected


async def test_a_provider_summary_model_is_a_fresh_instance_from_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEEL_TEST_KEY", "sk-test")
    gpt = {"name": "gpt", "use": "openai:gpt-4.1-mini", "api_key_env": "KEEL_TEST_KEY", "base_url": "http://127.0.0.1:1/v1"}
    harness = Harness(_config(tmp_path, {"demo": {"lead": LEAD}}, {**SUMMARIZE, "model": "gpt"}, (gpt,)))
    resolved = harness.resolve("lead")
    chain = harness.chain(resolved)
    await harness.build(resolved, {"metadata": {}}, chain)
    (member,) = [m for m in chain.middlewares if isinstance(m, Summarization)]
    assert isinstance(member._model, ChatOpenAI) and member._model.model_name == "gpt-4.1-mini"
    assert member._timeout_s == harness.models.call_timeout_s("gpt")
    run_model = harness.models.build("gpt")
    assert harness.summary_model("gpt", "gpt", run_model, None) is not run_model


def _keel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTKEEL_")}
    return subprocess.run([sys.executable, "-m", "agentkeel.cli", *args], cwd=cwd, env={**env, "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("summarization, error", [
    ({"enabled": True}, "limits.summarization: summarization is enabled without a trigger"),
    ({"enabled": True, "trigger_messages": 30, "model": "nope"}, "limits.summarization.model: 'nope' is not in models"),
])
def test_a_bad_summarization_config_is_a_start_up_error_naming_the_key(
    tmp_path: Path, summarization: dict[str, Any], error: str,
) -> None:
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump({"limits": {"summarization": summarization}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert error in str(info.value)
    result = _keel("run", "hi", "--config", str(path), cwd=tmp_path)
    assert result.returncode == 2 and error in result.stderr and "Traceback" not in result.stderr
