"""Start-up reporting of unusable provider models, as a user meets it: ``keel run`` refuses the run
(non-zero exit, the reason, no run record), ``keel serve`` warns once and keeps serving."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "gateway"))  # server_support, whichever import mode pytest uses

from server_support import start_server  # noqa: E402
from test_cli import keel  # noqa: E402

MISSING = "KEEL_TEST_MISSING_KEY"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "script.yaml").write_text(yaml.safe_dump({"agents": {"lead": [{"say": "Done."}]}}))
    config = {
        "data_dir": str(tmp_path / "data"),
        "models": [
            {"name": "gpt", "use": "openai:gpt-4.1-mini", "api_key_env": MISSING, "base_url": "http://127.0.0.1:9/v1"},
            {"name": "typo", "use": "opneai:gpt-4.1"},
            {"name": "fast", "use": "scripted", "script": "script.yaml"},
        ],
    }
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(autouse=True)
def key_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MISSING, raising=False)


def test_keel_run_for_an_unusable_model_exits_non_zero_with_the_reason_and_admits_nothing(project: Path) -> None:
    refused = keel("run", "hello", "--config", str(project), cwd=project.parent)  # lead uses the first model
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert f"run refused: assistant_id: model 'gpt' cannot be used: environment variable {MISSING} (the API key) is not set" in message
    assert "Traceback" not in refused.stderr
    typo = keel("run", "hello", "--config", str(project), "--model", "typo", cwd=project.parent)
    assert typo.returncode == 2 and "unknown provider 'opneai'" in typo.stderr
    listed = keel("runs", "list", "--json", "--config", str(project), cwd=project.parent)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []


def test_keel_serve_warns_about_each_unusable_model_and_refuses_its_runs_with_422(project: Path) -> None:
    assert MISSING not in os.environ
    server = start_server(project)
    try:
        output = server.output()
        assert (f"warning: model 'gpt' (openai:gpt-4.1-mini): environment variable {MISSING} (the API key) "
                "is not set — its runs are refused") in output
        assert "warning: model 'typo' (opneai:gpt-4.1): unknown provider 'opneai'" in output
        with httpx.Client(base_url=server.url, timeout=10) as http:
            tid = http.post("/threads", json={}).json()["thread_id"]
            assert http.get(f"/threads/{tid}/state").status_code == 200
            refused = http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "lead", "input": None})
            assert refused.status_code == 422 and "model 'gpt' cannot be used" in refused.json()["detail"]
            assert http.get(f"/threads/{tid}/runs").json() == []
    finally:
        assert server.stop() == 0
