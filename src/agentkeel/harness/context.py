"""The trusted runtime context every tool and middleware of a run sees.

It is built by the worker from the durable run record, never from caller input, so a caller cannot
pose as another thread, run or user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentkeel.harness.run_scope import RunScope
from agentkeel.harness.stop_reasons import StopReasonCollector
from agentkeel.harness.tool_replay import ToolReplay
from agentkeel.sandbox.bwrap import BashSandbox


class FileTouchRecorder(Protocol):
    """Receives "this tool call changed this workspace path" notes, for the run's change ledger
    (``after_sha256``: the file's sha256 once the call was done, when the tool could tell;
    ``agent``: the subagent that made the call, ``subagent:<type>/<task_id>``; None for the lead)."""

    def touched(
        self, virtual_path: str, tool_call_id: str | None, tool_name: str, after_sha256: str | None = None,
        agent: str | None = None,
    ) -> None: ...


class ProcessRegistry(Protocol):
    """Tracks child processes started for a run so a cancel can kill their process groups."""

    def register(self, pid: int) -> None: ...

    def unregister(self, pid: int) -> None: ...


class JournalSink(Protocol):
    """The run's journal (``runtime.journal.Journal``): ``record`` buffers (guards' interventions),
    ``write_through`` returns once the record is stored and raises if it could not be (tool-call
    intents, which must be durable before the tool runs)."""

    def record(self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None) -> int: ...

    async def write_through(
        self, kind: str, data: dict[str, Any] | None = None, caller: str | None = None
    ) -> int: ...


class UsageMeter(Protocol):
    """Running token totals of the whole run: every agent, subagent and middleware model call,
    counted as each call ends (``runtime.usage.UsageAccumulator``)."""

    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...

    def of_task(self, task_id: str) -> dict[str, int]:
        """``{input_tokens, output_tokens, total_tokens, calls}`` of one delegated task's calls."""
        ...


class TaskEvents(Protocol):
    """Receives a subagent's ``task_started`` / ``task_step`` / ``task_finished`` events;
    ``namespace`` is the child's graph namespace (the prefix of its own stream chunks)."""

    async def task_event(self, namespace: str, payload: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class RunContext:
    thread_id: str
    run_id: str
    workspace_root: Path
    user: str | None = None
    attempt: int = 1
    bash_enabled: bool = False
    bash_timeout_s: float = 60.0
    bash_output_cap: int = 32_000
    # The bubblewrap confinement of each bash call; None runs it unsandboxed (only when the
    # deployment set tools.bash_unsandboxed, or a graph runs outside the runtime).
    bash_sandbox: BashSandbox | None = None
    # The time limit of each file-system tool call (read_file, write_file, str_replace, ls, glob, grep).
    workspace_tool_timeout_s: float = 30.0
    # The byte caps of read_file (content returned) and write_file / str_replace (file produced).
    file_read_max_bytes: int = 100_000
    file_write_max_bytes: int = 10_000_000
    # The deployment's skills directory, which the file tools read as /skills (read-only); None
    # when there is none.
    skills_root: Path | None = None
    touches: FileTouchRecorder | None = None
    processes: ProcessRegistry | None = None
    # The run's single stop-reason writer; a standalone one when a graph runs outside the runtime.
    stop_reasons: StopReasonCollector = field(default_factory=StopReasonCollector.standalone)
    journal: JournalSink | None = None
    usage: UsageMeter | None = None
    # Tool calls an earlier attempt of this run started and never finished, that must not run again
    # blindly (call id -> what is known of it); the worker fills it on a recovered attempt and the
    # SideEffectLedger middleware answers those calls instead of running them.
    recovered_calls: Mapping[str, str] = field(default_factory=dict)
    # How each delegated task ended (task id -> outcome data), written by the subagent executor as
    # each child settles; the worker closes the ledger entries of a run that stopped before their
    # results reached it from here, partial output included.
    delegation_outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Where subagent progress events go (the run's stream); None: the graph's own custom stream.
    task_events: TaskEvents | None = None
    # A re-run's answerer of tool calls from the recording (``harness/tool_replay.py``); None for
    # every other run, whose tools run.
    tool_replay: ToolReplay | None = None
    # The run's own model, middleware instances and task executor when its graph is the assistant's
    # shared one (``harness/run_scope.py``); None for a graph built for this run alone.
    run_scope: RunScope | None = None
    extra: dict[str, Any] = field(default_factory=dict)
