"""Runs become OpenTelemetry spans in the process that executes them, with no gateway involved
(``keel worker`` and ``keel run`` as much as ``keel serve``): the runtime's own completion hook.

In a subprocess, because a process's global tracer provider can be set only once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPT = {"agents": {"lead": [
    {"say": "Listing.", "tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}], "usage": {"input": 10, "output": 2}},
    {"say": "Done.", "usage": {"input": 12, "output": 1}},
]}}

PROGRAM = """
import asyncio, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from agentkeel.config import load_config
from agentkeel.runtime.requests import RunRequest
from agentkeel.runtime.runtime import open_runtime

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    async with open_runtime(load_config(sys.argv[1])) as rt:
        record = await rt.manager.create(RunRequest(thread_id="traced", input="go"))
        final = await rt.manager.wait(record.run_id)
        assert final is not None and final.status.value == "success", final
    print(json.dumps(sorted(span.name for span in exporter.get_finished_spans())))

asyncio.run(main())
"""


def test_the_runtime_emits_a_runs_spans_without_a_gateway(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(SCRIPT))
    config = tmp_path / "keel.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "database": f"sqlite:///{tmp_path / 'keel.db'}",
        "models": [{"name": "scripted", "use": "scripted", "script": "script.yaml"}],
        "assistants": [{"assistant_id": "lead", "model": "scripted"}],
    }))
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    names = json.loads(done.stdout.strip().splitlines()[-1])
    assert names == ["agentkeel.model_call", "agentkeel.model_call", "agentkeel.run", "agentkeel.tool_call"]
