"""The trusted runtime context every tool and middleware of a run sees.

It is built by the worker from the durable run record, never from caller input, so a caller cannot
pose as another thread, run or user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class FileTouchRecorder(Protocol):
    """Receives "this tool call changed this workspace path" notes, for the run's change ledger."""

    def touched(self, virtual_path: str, tool_call_id: str | None, tool_name: str) -> None: ...


class ProcessRegistry(Protocol):
    """Tracks child processes started for a run so a cancel can kill their process groups."""

    def register(self, pid: int) -> None: ...

    def unregister(self, pid: int) -> None: ...


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
    touches: FileTouchRecorder | None = None
    processes: ProcessRegistry | None = None
    # The run's single stop-reason writer (``harness.stop_reasons.StopReasonCollector``).
    stop_reasons: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
