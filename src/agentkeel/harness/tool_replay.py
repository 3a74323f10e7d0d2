"""The hook a re-run answers tool calls through, and the miss that must never be swallowed.

Why a hook and not a different tool set: a re-run (``keel replay --rerun``) executes the same
harness — the same guards, chains and subagents — and only the bottom of the tool axis changes:
the call is answered from the recording instead of reaching the tool. The runtime builds the
answerer (``runtime/tool_replay.py``) from the recorded journal and checkpoints and hands it to the
run through :class:`~agentkeel.harness.context.RunContext`; ``SideEffectLedger``, at the innermost
edge, passes each call to it once the call's intent is journaled (so the re-run's journal has the
same intents). Every other run has no hook and is not touched.

A call the recording does not hold is a :class:`ToolReplayMiss`. It is not a tool failure the model
could be told about: ``ToolErrorHandling`` and the subagent executor let it through, so the run
fails with it, naming the call and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class ToolReplayMiss(Exception):
    """A re-run asked for a tool call the recording does not hold (or holds with other arguments)."""


class ToolReplay(Protocol):
    """Answers a re-run's tool calls: ``execute(request, handler)`` returns the recorded result
    (running ``handler`` on a stand-in tool, so the journal callbacks see the call as before), runs
    the call for real where the recording cannot answer it, and raises :class:`ToolReplayMiss`
    where the call is not the recorded one.

    ``recovered_calls``: the calls the recorded run's recovery answered with "outcome unknown"
    instead of running them (call id -> note; a recovered run's, else empty): the worker gives them
    to the re-run's ``RunContext``, so its SideEffectLedger answers them the same way."""

    recovered_calls: Mapping[str, str]

    async def execute(self, request: Any, handler: Any) -> Any: ...


__all__ = ["ToolReplay", "ToolReplayMiss"]
