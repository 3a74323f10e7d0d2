"""Closing the delegations a run leaves open.

A run's delegation ledger (the ``delegations`` channel) must never keep an entry ``in_progress``
once the run is over: a later run — or the same thread after compaction — would read it as work
still under way and neither redo nor retry it. However the run ended — an answer, a cap, a cancel,
a failure, its time limit — the worker settles its entries while finalizing (the agent itself
cannot: a cancelled run never reaches an end-of-run hook). It reads the thread's checkpointed ledger,
first takes in the results that did arrive before the run stopped (a subagent that finished is not
reported as cancelled because the model never got to read its result), and writes the updates as a neutral state edit (:meth:`StateAccessor.amutate`), through the
channel's reducer like any other write — a terminal status already there is never downgraded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.types import StateSnapshot

from agentkeel.harness.durable import DelegationEntry, closing_updates, merge_delegations
from agentkeel.harness.middleware.durable_context import outcome_update, result_updates
from agentkeel.runtime.checkpoints import StateAccessor
from agentkeel.runtime.records import RunStatus

CLOSE_NODE = "delegations_closed"
"""The writer the closing edit is recorded under in the thread's history."""

_CLOSED_AS: dict[RunStatus, tuple[str, str]] = {
    RunStatus.success: ("cancelled", "the run ended before the delegation reported a result"),
    RunStatus.interrupted: ("cancelled", "the run was stopped before the delegation finished"),
    RunStatus.timeout: ("timed_out", "the run hit its time limit before the delegation finished"),
    RunStatus.error: ("failed", "the run failed before the delegation finished"),
}


async def close_run_delegations(
    accessor: StateAccessor, thread_id: str, snapshot: StateSnapshot | None, run_id: str, status: RunStatus,
    outcomes: Mapping[str, dict[str, Any]] | None = None,
) -> int:
    """Settle the ``in_progress`` ledger entries of ``run_id`` after it ended with ``status``;
    returns how many were updated (usually 0: a delegation reports before the model goes on).

    ``snapshot``: the thread's state after the run, which the caller reads once and also needs
    for the thread's status (a full read decodes every message of the thread).

    ``outcomes``: how each delegated task ended as its subagent settled (task id -> outcome
    data), for the tasks whose result never reached the thread — a run cancelled while its
    children ran still records each child's status and partial result."""
    if status not in _CLOSED_AS or snapshot is None:
        return 0
    closed_as, reason = _CLOSED_AS[status]
    values = snapshot.values or {}
    ledger = values.get("delegations") or []
    found = result_updates(values.get("messages") or [], ledger)
    unreported = {e.get("id") for e in ledger if e.get("status") == "in_progress"} - {u.get("id") for u in found}
    found += [_settled(task_id, data, closed_as, reason) for task_id, data in (outcomes or {}).items()
              if task_id in unreported]
    updates = [*found, *closing_updates(merge_delegations(ledger, found), reason=reason, run_id=run_id, status=closed_as)]
    if updates:
        await accessor.amutate(thread_id, {"delegations": updates}, label=CLOSE_NODE, metadata={"run_id": run_id})
    return len(updates)


def _settled(task_id: str, data: dict[str, Any], closed_as: str, reason: str) -> DelegationEntry:
    """The ledger update of a task whose subagent settled but whose result never reached the
    thread. A child the run's own stop cancelled is closed as the run's end says — a timed-out
    run's child ``timed_out``, and why — its partial result kept (its own stop reasons are in its
    outcome and the journal); any other end is the child's."""
    update = outcome_update(task_id, data)
    if data.get("status") == "cancelled":
        update["status"], update["stop_reason"] = closed_as, reason
    return update


__all__ = ["CLOSE_NODE", "close_run_delegations"]
