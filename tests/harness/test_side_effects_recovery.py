"""A worker lost in the middle of a tool call, then the run resumed from its checkpoint: the
non-idempotent call is not executed twice and the model is told; an idempotent one runs again.

The "crash" is a ``BaseException`` raised inside the tool after its effect: nothing of the
attempt's own clean-up runs (no guard catches it, the journal is abandoned without a flush), and
the journal's flush interval is longer than the test, so only what was written through survives —
exactly what a ``kill -9`` leaves behind. The journal lives in SQLite, as on the embedded default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness, assert_provider_valid, script
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool

from agentkeel.database import Database
from agentkeel.harness.middleware.catalog import build_agent_chain
from agentkeel.harness.middleware.side_effect_ledger import TOOL_INTENT
from agentkeel.harness.tools.idempotency import declare_idempotent
from agentkeel.limits import Limits
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.journal import Journal
from agentkeel.runtime.journal_callbacks import JournalCallbackHandler
from agentkeel.runtime.side_effects import recovered_notes, unfinished_calls
from agentkeel.runtime.stores.base import JournalStore
from agentkeel.runtime.stores.factory import open_stores
from agentkeel.runtime.usage import UsageAccumulator


class WorkerLost(BaseException):
    """Stands in for the process dying mid-call."""


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[JournalStore]:
    async with open_connections(Database.parse(f"sqlite:///{tmp_path / 'keel.db'}")) as connections:
        yield (await open_stores(connections)).journal


def appender(log: Path, crashing: list[bool], idempotent: bool) -> BaseTool:
    def append_line(text: str) -> str:
        """Append a line to the log file.

        Args:
            text: The line.
        """
        with log.open("a") as f:
            f.write(text + "\n")
        if crashing[0]:
            raise WorkerLost
        return f"appended {text!r}"

    return declare_idempotent(tool("append_line", parse_docstring=True)(append_line), idempotent)


CALL = {"name": "append_line", "args": {"text": "payment sent"}, "id": "call_append"}


async def _attempt(harness: GuardHarness, store: JournalStore, attempt: int, **run: Any) -> Any:
    """One attempt of run r1 with its own journal (``flush_ms`` longer than the test)."""
    journal = await Journal.open(store, "r1", harness.thread_id, flush_ms=60_000)
    harness.journal, harness.attempt = journal, attempt
    harness.callbacks = [JournalCallbackHandler(journal, UsageAccumulator())]
    return await harness.run(**run)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_kill_mid_tool_then_resume(tmp_path: Path, store: JournalStore, idempotent: bool) -> None:
    log, crashing = tmp_path / "ws" / "log.txt", [True]
    answer = (
        {"expect": {"contains": "It was not repeated"}, "say": "I will read the log before retrying."}
        if not idempotent else {"expect": {"contains": "appended 'payment sent'"}, "say": "Done."}
    )
    harness = GuardHarness(
        script({"tool_calls": [CALL]}, answer), build_agent_chain("lead", Limits()).for_agent(),
        tmp_path / "ws", tools=[appender(log, crashing, idempotent)],
    )
    with pytest.raises(WorkerLost):
        await _attempt(harness, store, 1)
    assert log.read_text() == "payment sent\n"
    stored = await store.list("r1")
    unfinished = await unfinished_calls(store, "r1")
    if idempotent:
        # An idempotent call's intent is only buffered (recovery re-runs such a call anyway): with
        # the worker gone before the journal's next flush, nothing of the attempt was stored.
        assert stored == [] and unfinished == {}
    else:
        # The write-through stored the intent and everything before it; nothing after survived.
        assert [e.kind for e in stored] == ["model.call", TOOL_INTENT]
        assert list(unfinished) == ["call_append"] and unfinished["call_append"].attempt == 1
    harness.recovered_calls = recovered_notes(unfinished)
    assert bool(harness.recovered_calls) is not idempotent
    crashing[0] = False
    outcome = await _attempt(harness, store, 2, prompt=None)  # LangGraph resumes the tools step

    await outcome.journal.close()
    result = next(m for m in outcome.messages if isinstance(m, ToolMessage))
    if idempotent:  # at-least-once: it ran again, and the model got its real result
        assert log.read_text() == "payment sent\n" * 2
        assert result.status != "error"
        assert await unfinished_calls(store, "r1") == {}  # its tool.call closed the intent
    else:  # never blindly repeated: one effect, and the model knows the outcome is unknown
        assert log.read_text() == "payment sent\n"
        assert result.status == "error" and "outcome of this append_line call is unknown" in str(result.content)
        assert "started by attempt 1" in str(result.content)
        assert list(await unfinished_calls(store, "r1")) == ["call_append"]  # still unknown, honestly
    kinds = [e.kind for e in await store.list("r1")]
    assert ("intervention" in kinds) is not idempotent
    assert kinds.count(TOOL_INTENT) == 1  # the lost attempt's (write-through) or the resumed one's
    assert_provider_valid(outcome)
