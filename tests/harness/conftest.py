"""Fixtures the workspace-tool tests share: a thread's workspace and the run context on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkeel.harness.context import RunContext
from agentkeel.sandbox.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.for_thread(tmp_path / "data", "t1")


@pytest.fixture
def ctx(ws: Workspace) -> RunContext:
    return RunContext(thread_id="t1", run_id="r1", workspace_root=ws.root)
