"""A re-run's tool calls answered from the recording: the tool is not executed, a miss is loud.

Why: a re-run that executes its tools again is not a replay of the run but a second run with the
same model answers — a tool with an effect outside the workspace (a web search, a ``bash`` reaching
the network, a counter somewhere) would act twice, and a tool whose world changed would answer
differently. :class:`RecordedTools` is the run's :class:`~agentkeel.harness.tool_replay.ToolReplay`:
``SideEffectLedger`` hands it every call once the call's intent is journaled.

What the recording holds, per agent (``lead``, or a subagent's task id — the key the exported
script uses too): every executed call in order, from its ``tool.call`` record (status, result
digest), with its name and arguments from the ``model.call`` that asked for it, and its result
text — the lead's from the thread's checkpointed messages, a child's from ``result_text`` (the
journal callback keeps it up to ``RESULT_TEXT_MAX_CHARS``).

Which calls run anyway: those of the built-in tools whose effects stay inside the workspace
(:data:`WORKSPACE_CONFINED`: the file tools), in the re-run's own fresh workspace — what they do
follows from their arguments and the files before them, and the guards that read the workspace
must see the files they saw. They are matched like every call, and a result that differs from the
recorded one is a miss too.

How a call is answered: it is looked up by its tool-call id (the export writes the recorded ids
out), else it is taken to be the agent's next recorded call; its name and arguments must equal the
recording's, and every recorded call of the agent's earlier model turns must have been asked
before it (the calls of one turn run in parallel, in any order), or it is a
:class:`~agentkeel.harness.tool_replay.ToolReplayMiss` naming the call, its position and what was
expected, and the run fails on it (a call beyond the recording or asked twice too). A matching call whose recorded text hashes to the recorded ``result_sha256`` is answered by a
stand-in tool returning that result (content, status, name, id) — run through the ordinary tool
path, so the journal callbacks record the same ``tool.call`` and the outer guards see the same
result. A call whose tool raised is answered by a stand-in that raises the recorded exception
again — its type's name and its text (``error_type`` and ``error_message`` of the ``tool.call``; a
lead call of an older journal, the text quoted in its checkpointed error result) — so the same
error result, ``tool_exception`` intervention and ``tool.call`` record follow, and the tool does
not run. Where the recording holds no text (a child's result over the cap, a result a guard changed
before it was checkpointed, an exception whose text is not recorded, an interrupted call), the call
runs for real and its digest is checked; :attr:`RecordedTools.live` says which calls and why.
``task`` calls are never answered: their subagents run again, with their own calls answered the
same way.

A recovered run (several attempts) is answered as it finished (``runtime/finished_run.py``): a
call its lost attempt ran and the next attempt ran again has the later result; a call the recovery
did not repeat (``recovered_call``: "outcome unknown") is in :attr:`RecordedTools.recovered_calls`,
which the worker hands to the re-run's SideEffectLedger, so it answers it as the recovery did.

What is not reproduced: an answered call's effect on the workspace (a ``bash`` command that wrote
a file): the re-run's files then differ from the recording's, and the comparison says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import BaseTool

from agentkeel.harness.middleware.keys import TASK_ID_METADATA
from agentkeel.harness.subagents import TASK_TOOL
from agentkeel.harness.tool_replay import ToolReplayMiss
from agentkeel.runtime.finished_run import as_finished, recovered_calls
from agentkeel.runtime.journal_callbacks import result_digest, tool_message
from agentkeel.runtime.stores.base import JournalEvent

LEAD = "lead"
# The built-in tools whose every effect stays inside the thread's workspace. They run in a re-run,
# in its own fresh workspace: what they do follows from their arguments and the files before them,
# which the re-run reproduces, and the guards that read the workspace (ReadBeforeWrite's "changed
# since read") must see the files they saw. Their calls are still matched and their results checked.
WORKSPACE_CONFINED = frozenset({"read_file", "write_file", "str_replace", "ls", "glob", "grep"})
# The error result ToolErrorHandling wrote for a tool that raised (``exception_message``): the
# exception's text is quoted in it, for a journal whose ``tool.call`` predates ``error_message``.
_RAISED = re.compile(r"Error: tool .+? failed with (?P<type>[^:]+): (?P<text>.*)\. Continue with the context "
                     r"you have, or choose another tool\.", re.DOTALL)


@dataclass
class RecordedCall:
    """One executed call of the recording, and what answers it (``text`` None: nothing does)."""

    agent: str
    position: int  # 1-based, among the agent's executed calls
    call_id: str
    name: str
    args: Any
    status: str
    sha256: str | None
    text: str | None
    turn: int  # the journal seq of the model call that asked for it: calls of one turn may run in any order
    why_live: str | None = None  # why the call runs for real, when it does
    raised: tuple[str, str] | None = None  # the tool raised: its exception's type name and text


@dataclass
class RecordedTools:
    """The recording's tool calls, per agent; answers a re-run's calls (see the module docstring)."""

    calls: dict[str, list[RecordedCall]]
    answered: list[str] = field(default_factory=list)  # "<agent> #n name (id)"
    live: list[tuple[str, str]] = field(default_factory=list)  # (the same, why the call ran for real)
    misses: list[str] = field(default_factory=list)
    recovered_calls: Mapping[str, str] = field(default_factory=dict)  # see the module docstring
    _used: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def from_recording(cls, events: list[JournalEvent], messages: list[BaseMessage]) -> RecordedTools:
        """Built from the recorded run's journal and its thread's checkpointed messages."""
        ordered = as_finished(events)
        asked = {str(c.get("id")): (e.seq, c) for e in ordered if e.kind == "model.call"
                 for c in (e.data.get("output") or {}).get("tool_calls") or []}
        lead_texts = {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}
        calls: dict[str, list[RecordedCall]] = {}
        for event in ordered:
            data = event.data
            if event.kind != "tool.call" or data.get("name") == TASK_TOOL:
                continue
            agent = str(data.get("task_id") or LEAD)
            call_id = str(data.get("call_id") or "")
            turn, ask = asked.get(call_id) or (event.seq, {})
            text = data.get("result_text") if agent != LEAD else lead_texts.get(call_id)
            sha = data.get("result_sha256")
            call = RecordedCall(agent, len(calls.get(agent, [])) + 1, call_id, str(data.get("name")),
                                ask.get("args") or {}, str(data.get("status")), sha,
                                text if isinstance(text, str) else None, turn)
            call.raised = _raised(data, call.text)
            call.why_live = _why_live(call, data)
            calls.setdefault(agent, []).append(call)
        return cls(calls, recovered_calls=recovered_calls(ordered))

    async def execute(self, request: Any, handler: Any) -> Any:
        call = request.tool_call
        agent = _agent_of(request)
        name, call_id, args = str(call.get("name") or ""), str(call.get("id") or ""), call.get("args") or {}
        if name == TASK_TOOL:
            return await handler(request)
        recorded = self._match(agent, name, call_id, args)
        label = f"{agent} #{recorded.position} {name} ({call_id})"
        if recorded.why_live is not None:
            result = await handler(request)
            message = tool_message(result)
            if recorded.sha256 is not None and (message is None or result_digest(message) != recorded.sha256):
                self._miss(f"tool call {label} ran ({recorded.why_live}) and its result differs from the "
                           f"recorded one (sha256 {recorded.sha256[:12]}…)", ran=True)
            self.live.append((label, recorded.why_live))
            return result
        self.answered.append(label)
        if recorded.raised is not None:  # the tool raised: so does its stand-in, with the same exception
            kind, text = recorded.raised
            return await handler(request.override(tool=_Raising(name=name, description=f"recorded {name}",
                                                                 error_type=kind, error_text=text)))
        message = ToolMessage(content=recorded.text or "", name=name, tool_call_id=call_id,
                              status="error" if recorded.status == "error" else "success")
        return await handler(request.override(tool=_Recorded(name=name, description=f"recorded {name}",
                                                             result=message)))

    def _match(self, agent: str, name: str, call_id: str, args: Any) -> RecordedCall:
        calls = self.calls.get(agent, [])
        recorded = next((c for c in calls if c.call_id == call_id), None) if call_id else None
        if recorded is None:  # no id to go by: the agent's next recorded call
            recorded = next((c for c in calls if (agent, c.call_id) not in self._used), None)
        where = f"tool call {name}({_json(args)}) id {call_id or '-'} of agent {agent}"
        if recorded is None:
            self._miss(f"{where}: the recording holds {len(calls)} call(s) of this agent, all answered")
        assert recorded is not None
        if (agent, recorded.call_id) in self._used:
            self._miss(f"{where}: recorded call #{recorded.position} was already answered (asked twice)")
        if (recorded.name, _json(recorded.args)) != (name, _json(args)):
            self._miss(f"{where}: expected recorded call #{recorded.position} "
                       f"{recorded.name}({_json(recorded.args)}) id {recorded.call_id}")
        earlier = next((c for c in calls if c.turn < recorded.turn and (agent, c.call_id) not in self._used), None)
        if earlier is not None:
            self._miss(f"{where}: it is recorded call #{recorded.position}, asked before recorded call "
                       f"#{earlier.position} {earlier.name}({_json(earlier.args)}) of an earlier turn (out of order)")
        self._used.add((agent, recorded.call_id))
        return recorded

    def _miss(self, detail: str, ran: bool = False) -> None:
        self.misses.append(detail)
        raise ToolReplayMiss(f"re-run: {detail}" + ("" if ran else " — the call was not executed"))


class _Recorded(BaseTool):
    """The stand-in for a tool whose call the recording answers: returns the recorded result."""

    result: ToolMessage

    def _run(self, *args: Any, **kwargs: Any) -> ToolMessage:
        return self.result

    async def _arun(self, *args: Any, **kwargs: Any) -> ToolMessage:
        return self.result


class _Raising(BaseTool):
    """The stand-in for a tool that raised: raises an exception of the recorded type's name and text."""

    error_type: str
    error_text: str

    def _error(self) -> Exception:
        return type(self.error_type, (Exception,), {"__module__": __name__})(self.error_text)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error()

    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error()


def _raised(data: dict[str, Any], text: str | None) -> tuple[str, str] | None:
    """The recorded exception of a call whose tool raised: from the journal, else from the lead's
    checkpointed error result; None if the tool did not raise or the text is nowhere."""
    kind = data.get("error_type")
    if data.get("status") != "error" or not isinstance(kind, str) or not kind:
        return None
    if isinstance(data.get("error_message"), str):
        return kind, data["error_message"]
    quoted = _RAISED.fullmatch(text.strip()) if text else None
    return (kind, quoted["text"]) if quoted is not None and quoted["type"] == kind else None


def _why_live(call: RecordedCall, data: dict[str, Any]) -> str | None:
    if call.name in WORKSPACE_CONFINED:
        return "its effects stay in the workspace, which the re-run reproduces"
    if data.get("error_type") and call.status == "error":
        return None if call.raised is not None else "the recorded call raised and its exception text is not recorded"
    if call.status not in ("ok", "error"):
        return f"the recorded call was {call.status}"
    if call.text is None:
        return ("its result is over the journal's text cap (only its digest is recorded)" if call.agent != LEAD
                else "its result is not in the checkpointed messages")
    if result_digest(ToolMessage(content=call.text, tool_call_id=call.call_id)) != call.sha256:
        return "the checkpointed result is not what the tool returned (a guard changed it)"
    return None


def _agent_of(request: Any) -> str:
    config = getattr(request.runtime, "config", None) or {}
    task = (config.get("metadata") or {}).get(TASK_ID_METADATA)
    return str(task) if task else LEAD


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@dataclass
class LiveTools:
    """``--live-tools``: every call runs, but the calls a recovered run did not repeat are answered
    as its recovery answered them (``recovered_calls``; the tool never ran to an end there)."""

    recovered_calls: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_recording(cls, events: list[JournalEvent]) -> LiveTools:
        return cls(recovered_calls(events))

    async def execute(self, request: Any, handler: Any) -> Any:
        return await handler(request)


__all__ = ["LiveTools", "RecordedCall", "RecordedTools"]
