"""Fixtures of the subagent suite: the run-lifecycle helpers (``tests/runtime/runtime_support``)
on memory:// with the memory bridge, and the provider stubs (``tests/providers``) for the replay
over HTTP.

Why memory:// only: what is checked here — how children end, what the lead and the journal learn,
how many run at once — is the executor's and the worker's behaviour, not the backends'; the
backend matrix is ``tests/runtime``'s job.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
for folder in ("runtime", "providers", "gateway", "subagents"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

from provider_support import openai_stub, openai_stub_process, stub_key  # noqa: E402, F401
from runtime_support import Backend, Keel  # noqa: E402

from agentkeel.runtime.checkpoints import mode as mode_module  # noqa: E402


@pytest.fixture
async def keel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Keel]:
    """A :class:`Keel` on memory:// (the checkpoint mode un-frozen for the test, as in tests/runtime)."""
    monkeypatch.setattr(mode_module, "_frozen", None)
    yield Keel(Backend("memory", "memory", "memory://", "memory"), tmp_path)
