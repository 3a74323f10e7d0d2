"""Deterministic re-execution of a recorded run, and forks from any aligned point of it.

**Re-run** (:func:`rerun`): the run again, on a new thread, with every model of the config swapped
for the scripted model playing the run's export (``runtime/script_export.py``) — the same
assistant, input, limits and tools, no provider reachable. Model outputs come from the recording
(a call beyond it fails loudly: the script ends in ``fallback: error``), and so do tool results
when the re-run is given :func:`recorded_tools` (``runtime/tool_replay.py``: a tool is not
executed, a call the recording does not hold fails the run); without them, tools run for real in
the new thread's workspace. Either way :func:`compare` holds the results to the recording's (each
``tool.call`` journals its result's ``result_sha256``) along with everything else the journal and
the final state say. Equal means: the same journal record for record (kinds, callers, data,
timings and owners aside) and the same final state (messages, durable channels, workspace files).

**Fork** (:func:`fork`): a new run on the recorded thread from the run's checkpoint at a
superstep, with a live model of the config or a scripted one — LangGraph's time travel: what
the checkpoint already holds is kept, and everything after it executes again.

A run that was not its thread's first is re-run from where it started (``runtime/replay_thread.py``):
the new thread gets the checkpoint before the run and the workspace's files as they were then, and
the comparison is with the run's own journal, state at its last checkpoint and files as it left
them. A recovered run (several attempts) is compared as it finished (``runtime/finished_run.py``):
what its lost attempt did that the next attempt did again is left out, attempt numbers aside.

What a re-run cannot reproduce is reported as *not reproducible*, not as a divergence: a file whose
content before the run is gone (the journal keeps hashes of changed files, not their content), and
the files an answered tool call changed (a ``bash`` command that wrote a file is not executed, so
its file is not written): :func:`replay_and_compare` leaves them out of the comparison and names them.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agentkeel.config import KeelConfig
from agentkeel.harness.durable import durable_values
from agentkeel.runtime.finished_run import as_finished, is_multi_attempt
from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.replay_thread import ReplayError, RunBounds, run_bounds, seed_thread, workspace_files
from agentkeel.runtime.requests import request_from_record
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.timeline import checkpoint_items
from agentkeel.runtime.tool_replay import LiveTools, RecordedTools
from agentkeel.sandbox.workspace import Workspace, to_relpath, to_virtual

# Journal data that differs between two executions of the same run by nature, not by behaviour
# (``stream_seq``: the last id of the run's stream, which counts every attempt's events).
VOLATILE = frozenset({"latency_ms", "duration_ms", "duration_s", "queued_s", "owner", "lease_expired_at",
                      "seq", "tool_seq", "subagent_seq", "created_at", "updated_at", "started_at", "ended_at", "at",
                      "stream_seq"})
# Journal data that says which attempt did it: a recovered run's is compared as it finished, with the
# re-run's single attempt (``runtime/finished_run.py``).
ATTEMPTS = frozenset({"attempt", "resumed_from", "lost_attempt"})


def offline_config(config: KeelConfig, script: Path) -> KeelConfig:
    """``config`` with every model (names kept, so journals compare) played by ``script``."""
    models = [m.model_copy(update={"use": "scripted", "script": str(script.resolve()), "api_key_env": None,
                                   "base_url": None, "options": {}}) for m in config.models]
    return config.model_copy(update={"models": models})


async def first_of_thread(runtime: Any, record: RunRecord) -> bool:
    """Whether the run started its thread (its first checkpoint has no parent)."""
    return (await run_bounds(runtime, record)).first_of_thread


async def rerun(runtime: Any, record: RunRecord, thread_id: str | None = None,
                tools: RecordedTools | None = None, bounds: RunBounds | None = None) -> RunRecord:
    """Execute ``record``'s request again on a new thread of ``runtime`` (whose config is the
    :func:`offline_config`), set up as the recorded thread was when the run began (``bounds``,
    ``runtime/replay_thread.py``); the replay's final record. With ``tools`` (built from the
    recording, ``runtime/tool_replay.py``) the recording answers the tool calls; without, they run
    (but the calls a recovered run did not repeat are answered as its recovery answered them)."""
    bounds = bounds or await run_bounds(runtime, record)
    request = dataclasses.replace(
        request_from_record(record), thread_id=thread_id or f"replay-{uuid.uuid4().hex[:12]}", checkpoint=None,
        metadata={**record.metadata, "replay_of": record.run_id},
    )
    await seed_thread(runtime, bounds, request.thread_id)
    answerer = tools if tools is not None else LiveTools.from_recording(await runtime.journal.list(record.run_id))
    runtime.manager.tool_replays[request.thread_id] = answerer
    try:
        return await _run(runtime, request)
    finally:
        runtime.manager.tool_replays.pop(request.thread_id, None)


async def recorded_tools(runtime: Any, record: RunRecord, bounds: RunBounds | None = None) -> RecordedTools:
    """What answers a re-run's tool calls: the run's journal and its messages at its last checkpoint."""
    bounds = bounds or await run_bounds(runtime, record)
    return RecordedTools.from_recording(await runtime.journal.list(record.run_id),
                                        await _messages(runtime, record, bounds.last))


async def _messages(runtime: Any, record: RunRecord, checkpoint_id: str | None) -> list[BaseMessage]:
    accessor = await runtime.accessor(record.assistant_id)
    snapshot = await accessor.aget(record.thread_id, checkpoint_id)
    return list((snapshot.values if snapshot is not None else {}).get("messages") or [])


async def fork(runtime: Any, record: RunRecord, step: int, *, model_name: str | None = None,
               input: Any = None) -> RunRecord:
    """A new run on ``record``'s thread from its root checkpoint at superstep ``step``."""
    roots = [c for c in await checkpoint_items(runtime.checkpointer, record) if not c.data["namespace"]]
    target = next((c for c in roots if c.step == step), None)
    if target is None:
        raise ReplayError(f"run {record.run_id} has no checkpoint at step {step} "
                          f"(its steps: {[c.step for c in roots]})")
    request = dataclasses.replace(
        request_from_record(record), input=input, command=None,
        checkpoint={"checkpoint_id": str(target.ident)},
        model_name=model_name or request_from_record(record).model_name,
        metadata={**record.metadata, "forked_from": {"run_id": record.run_id, "step": step}},
    )
    return await _run(runtime, request)


async def _run(runtime: Any, request: Any) -> RunRecord:
    created = await runtime.manager.create(request)
    final = await runtime.manager.wait(created.run_id)
    if final is None:
        raise ReplayError(f"run {created.run_id} was deleted before it could be read")
    return final


# -- comparing two executions -----------------------------------------------------------------


@dataclass
class RerunReport:
    """A re-run and how it compares with the recording (``differences``: empty when equal)."""

    recorded: RunRecord
    replayed: RunRecord
    tools: RecordedTools | None  # None: the tools ran (``--live-tools``)
    differences: list[str]
    not_reproducible: list[str]  # paths left out of the comparison, each with why
    records: int  # the recorded journal records the re-run was held to
    remarks: list[str] = field(default_factory=list)  # what else the comparison left out


async def replay_and_compare(runtime: Any, record: RunRecord, *, live_tools: bool = False) -> RerunReport:
    """Re-run ``record`` on ``runtime`` (an :func:`offline_config` one) and compare it with the
    recording: journal and final state, less what cannot be reproduced (the module docstring)."""
    bounds = await run_bounds(runtime, record)
    recorded_events = await runtime.journal.list(record.run_id)
    tools = None if live_tools else await recorded_tools(runtime, record, bounds)
    replayed = await rerun(runtime, record, tools=tools, bounds=bounds)
    effects = answered_effects(recorded_events, tools) if tools is not None else {}
    skip = frozenset(bounds.not_reproducible) | frozenset(effects)
    multi = is_multi_attempt(recorded_events)
    expected = journal_signature(recorded_events, record, files=not multi, skip_paths=skip)
    actual = journal_signature(await runtime.journal.list(replayed.run_id), replayed, record, files=not multi,
                               skip_paths=skip)
    differences = compare(expected, actual, "journal")
    differences += compare(await final_state(runtime, record, bounds=bounds, skip_paths=skip),
                           await final_state(runtime, replayed, record, skip_paths=skip), "state")
    if replayed.status != record.status:
        differences.insert(0, f"status: recorded {record.status.value}, replayed {replayed.status.value}"
                              f"{f' ({replayed.error})' if replayed.error else ''}")
    differences[:0] = [f"tool replay miss: {miss}" for miss in tools.misses] if tools else []
    gone = [f"{to_virtual(p)}: its content before the run is not kept (the journal holds only the hashes of "
            "changed files)" for p in bounds.not_reproducible]
    remarks = [f"a recovered run ({len({e.attempt for e in recorded_events if e.attempt})} attempts) is compared as "
               "it finished; its file.changed records cover its last attempt only, so files are compared by their "
               "final hashes"] if multi else []
    if not bounds.first_of_thread:
        remarks.append(f"started from checkpoint {bounds.start} of thread {record.thread_id} (the run was not "
                       "its thread's first)")
    return RerunReport(record, replayed, tools, differences,
                       gone + [f"{to_virtual(p)}: {why}" for p, why in effects.items()],
                       sum(len(v) for v in expected.values()), remarks)


def answered_effects(events: list[JournalEvent], tools: RecordedTools) -> dict[str, str]:
    """Workspace path -> why the re-run cannot reproduce its change: a tool call that changed it is
    answered from the recording (not executed), or no tool reported changing it (a shell command)
    while some calls are answered. The journal keeps a changed file's hashes, not its content."""
    answered = {c.call_id: c for calls in tools.calls.values() for c in calls if c.why_live is None}
    out: dict[str, str] = {}
    for event in as_finished(events):
        rel = to_relpath(str(event.data.get("path") or "")) if event.kind == "file.changed" else None
        if rel is None:
            continue
        steps = event.data.get("steps") or []
        by = [answered[str(s.get("tool_call_id"))] for s in steps if str(s.get("tool_call_id")) in answered]
        if by:
            out[rel] = (f"changed by {by[0].name} call {by[0].call_id}, answered from the recording (not executed); "
                        "the journal keeps the file's hashes, not its content: not reproducible")
        elif not steps and answered:
            out[rel] = ("changed by no tool that reported it (a shell command?) while tool calls are answered from "
                        "the recording; the journal keeps the file's hashes, not its content: not reproducible")
    return out



def journal_signature(events: list[JournalEvent], *records: RunRecord, files: bool = True,
                      skip_paths: frozenset[str] = frozenset()) -> dict[str, list[Any]]:
    """The journal as comparable data: per agent (``run``, or a child's task id) its records in
    order — kind, caller, step and data, without what differs by nature (timings, owners, seqs)
    and with the ids of ``records`` (the run; for a replay, the recorded run too, whose tool-call
    ids it plays) replaced by placeholders. A recovered run's journal as it finished
    (``runtime/finished_run.py``), and nobody's attempt numbers. Without ``files``, no
    ``file.changed`` records (a recovered run's cover its last attempt only); never those of
    ``skip_paths`` (workspace-relative paths the re-run cannot reproduce).

    Why per agent: children running in parallel interleave in the journal as the scheduler
    happens to run them; each child's own records are sequential, and so is the run's at the
    grain of its supersteps (within one, e.g. the results of parallel task calls, the order is
    the children's finishing order, so records of one step are compared as a set).
    """
    names = _placeholders(*records)
    groups: dict[str, list[tuple[int | None, str]]] = {}
    for e in as_finished(events):
        if e.kind == "file.changed" and (not files or to_relpath(str(e.data.get("path") or "")) in skip_paths):
            continue
        data = _strip(e.data, VOLATILE | ATTEMPTS)
        entry = _normal({"kind": e.kind, "caller": e.caller, "step": e.step, "data": data}, names)
        group = str(e.data.get("task_id") or "run") if e.kind != "stop_reason" else "run"
        groups.setdefault(_normal(group, names), []).append((e.step, json.dumps(entry, sort_keys=True, default=str)))
    out: dict[str, list[Any]] = {}
    for group, entries in groups.items():
        if group == "run":
            entries = sorted(entries, key=lambda x: (x[0] if x[0] is not None else -1, x[1]))
        out[group] = [json.loads(text) for _, text in entries]
    return out


async def final_state(runtime: Any, record: RunRecord, *also: RunRecord, bounds: RunBounds | None = None,
                      skip_paths: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The thread's messages and durable channels, and the workspace's files (path -> sha256, none
    of ``skip_paths``); ids as in :func:`journal_signature`. With ``bounds`` (:func:`run_bounds` of
    ``record``): the run's own — its state at its last checkpoint, its files as it left them —
    whatever later runs of the thread did."""
    accessor = await runtime.accessor(record.assistant_id)
    snapshot = await accessor.aget(record.thread_id, bounds.last if bounds is not None else None)
    values = snapshot.values if snapshot is not None else {}
    if bounds is not None:
        files = dict(bounds.files_after)
    else:
        files = await workspace_files(Workspace.for_thread(runtime.config.data_path, record.thread_id).real_root)
    files = {path: sha for path, sha in files.items() if path not in skip_paths}
    messages = list(values.get("messages") or [])
    state = {"messages": [_message(m) for m in messages], "durable": durable_values(values), "files": files}
    # Message ids are random for user and tool messages: a durable record names them by position.
    names = {str(m.id): f"<message {i}>" for i, m in enumerate(messages) if m.id} | _placeholders(record, *also)
    return dict(_normal(_strip(json.loads(json.dumps(state, default=str))), names))


def compare(expected: Any, actual: Any, path: str = "", limit: int = 20) -> list[str]:
    """Where ``actual`` differs from ``expected`` (at most ``limit`` places, each with its path)."""
    out: list[str] = []
    _diff(expected, actual, path or "$", out, limit)
    return out


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(dict.fromkeys([*a, *b])):
            _diff(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}", out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            _diff(a[index] if index < len(a) else "<missing>", b[index] if index < len(b) else "<missing>",
                  f"{path}[{index}]", out, limit)
    elif a != b:
        out.append(f"{path}: recorded {_short(a)}, replayed {_short(b)}")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:119] + "…"


def _message(message: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"type": message.type, "text": message.text}
    if isinstance(message, AIMessage):
        out["tool_calls"] = [{"id": c.get("id"), "name": c["name"], "args": c["args"]} for c in message.tool_calls]
    if isinstance(message, ToolMessage):
        out |= {"tool_call_id": message.tool_call_id, "name": message.name, "status": message.status}
    return out


def _placeholders(*records: RunRecord) -> dict[str, str]:
    names: dict[str, str] = {}
    for record in records:  # the full ids first: the scripted model's ids use the run id's first 8
        names |= {record.run_id: "<run>", record.thread_id: "<thread>"}
    for record in records:
        names[record.run_id[:8]] = "<run>"
    return names


def _strip(value: Any, keys: frozenset[str] = VOLATILE) -> Any:
    """``value`` without ``keys`` (:data:`VOLATILE`), at any depth."""
    if isinstance(value, dict):
        return {k: _strip(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_strip(v, keys) for v in value]
    return value


def _normal(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, placeholder in names.items():
            value = value.replace(name, placeholder)
        return value
    if isinstance(value, list):
        return [_normal(v, names) for v in value]
    if isinstance(value, dict):
        return {_normal(k, names): _normal(v, names) for k, v in value.items()}
    return value


__all__ = ["ReplayError", "RerunReport", "answered_effects", "compare", "final_state", "first_of_thread", "fork",
           "journal_signature", "offline_config", "recorded_tools", "replay_and_compare", "rerun"]
