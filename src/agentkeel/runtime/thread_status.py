"""A thread's status (``idle | busy | interrupted | error``), derived by one rule everywhere."""

from __future__ import annotations

from langgraph.types import StateSnapshot

from agentkeel.runtime.records import RunStatus

# The status a thread settles in when its run ends that way (success is refined by its state).
AFTER_RUN = {
    RunStatus.success: "idle",
    RunStatus.interrupted: "interrupted",
    RunStatus.error: "error",
    RunStatus.timeout: "error",
}


def settled_status(snapshot: StateSnapshot | None) -> str:
    """A thread's status when no run is active, by the official server's rule: ``interrupted``
    while its head has nodes still to run (``interrupt()``, ``interrupt_before/after``, a stopped
    run), else ``idle``."""
    return "interrupted" if snapshot is not None and snapshot.next else "idle"
