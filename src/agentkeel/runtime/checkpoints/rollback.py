"""Capturing a thread's pre-run state and putting it back when a run is rolled back.

The hazard this module exists to prevent: a rollback that has no trustworthy record of the
pre-run state must not guess. DeerFlow conflated "the thread had no checkpoint" with "capture never
happened" (both were None), so a rollback arriving before capture deleted a thread's whole
history. Here the two are different values: an empty-thread ``RollbackPoint`` (restoring it
deletes the thread's checkpoints, which is correct because there were none before the run) versus
no point at all / a failed capture (``RollbackUnavailable``: the caller refuses to roll back and
leaves history as it is).

Restoring never deletes the run's checkpoints: it forks the pre-run checkpoint into a new head, so
the abandoned run stays in history as an audit trail and reads of the thread see exactly the
pre-run state. Two ways to fork, chosen by what the pre-run head was:

* settled (nothing scheduled — the usual case): a neutral edit on the pre-run checkpoint that
  overwrites the replayed channels with the captured lists. Its parent is the pre-run checkpoint
  and in delta mode it stores a full snapshot, so it does not depend on replaying the run's writes
  (which LangGraph stored on that same checkpoint).
* suspended (tasks scheduled, e.g. waiting on a human after ``interrupt()``): any edit is a step
  that would drop the scheduled tasks and leave, say, a tool call without its answer, so the
  checkpoint is copied instead (LangGraph's ``__copy__`` fork: same channels, same tasks; it is
  recorded as ``source: fork`` beside the pre-run checkpoint, a sibling rather than a child).

Either way the head's pending writes (an interrupt, results of tasks that finished in a failed
step) are put back; task ids derive from the checkpoint id, so they are mapped to the new head's
tasks by (node, path). Finally the new head is read back and compared with the capture.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, PendingWrite
from langgraph.types import Overwrite, StateSnapshot

from agentkeel.harness.state import CheckpointMode
from agentkeel.runtime.checkpoints.accessor import StateAccessor, checkpoint_config
from agentkeel.runtime.checkpoints.mode import CheckpointModeError

RESTORE_NODE = "rollback_restore"
RESTORED_FROM_KEY = "agentkeel_restored_from"

TaskKey = tuple[str, tuple[Any, ...]]  # (node name, task path): stable across a fork


class RollbackUnavailable(RuntimeError):
    """There is no trustworthy pre-run state to restore; the rollback must be refused."""


@dataclass(frozen=True)
class RollbackPoint:
    """A thread's state just before a run wrote anything to it.

    ``checkpoint_id is None`` means the thread had no checkpoint (an explicit, restorable fact —
    a failed capture never yields a point). ``tasks`` maps the id of each task scheduled at the
    checkpoint to its (node, path); ``pending_writes`` are the raw ``(task_id, channel, value)``
    writes stored on it.
    """

    thread_id: str
    mode: CheckpointMode
    checkpoint_id: str | None
    values: Mapping[str, Any]
    metadata: Mapping[str, Any] | None
    pending_writes: tuple[PendingWrite, ...]
    tasks: Mapping[str, TaskKey]

    @property
    def empty_thread(self) -> bool:
        return self.checkpoint_id is None


async def capture_rollback_point(
    accessor: StateAccessor, thread_id: str, head_read: Callable[[CheckpointTuple | None], None] | None = None,
) -> RollbackPoint:
    """Record the thread's head before a run starts writing; call it before the graph runs.

    Raises ``RollbackUnavailable`` when the state cannot be captured completely, and
    ``CheckpointModeError`` (unwrapped) when the thread was written in the other mode — then the
    run itself must not start, not just its rollback be refused. ``head_read`` is given the raw
    head tuple as soon as it is read (None: no checkpoint), so the run's graph can start from it
    instead of reading it again (``StampingSaver.prime_head``); the point keeps no reference to it.
    """
    try:
        head = await accessor.araw_tuple(thread_id)
        if head_read is not None:
            head_read(head)
        if head is None:
            return RollbackPoint(thread_id, accessor.mode, None, {}, None, (), {})
        # Restoring may need the mutation graph; find out now, not when the rollback is asked for.
        accessor.mutation_graph(RESTORE_NODE)
        checkpoint_id = head.config["configurable"]["checkpoint_id"]
        # Materialize at that id rather than "the head", so values, tasks and pending writes all
        # describe the same checkpoint even if something wrote in between.
        snapshot = await accessor.aget(thread_id, checkpoint_id)
        if snapshot is None:
            raise RollbackUnavailable(f"checkpoint {checkpoint_id!r} vanished during capture")
    except (CheckpointModeError, RollbackUnavailable):
        raise
    except Exception as exc:
        raise RollbackUnavailable(f"could not capture thread {thread_id!r}: {exc}") from exc
    return RollbackPoint(
        thread_id=thread_id,
        mode=accessor.mode,
        checkpoint_id=checkpoint_id,
        values={k: list(v) if isinstance(v, list) else v for k, v in snapshot.values.items()},
        metadata=dict(head.metadata or {}),
        pending_writes=tuple((w[0], w[1], w[2]) for w in head.pending_writes or ()),
        tasks={t.id: (t.name, t.path) for t in snapshot.tasks},
    )


async def restore_rollback_point(
    accessor: StateAccessor, point: RollbackPoint | None
) -> RunnableConfig | None:
    """Make the pre-run state the thread's head again; returns the new head's config.

    ``point=None`` (nothing was captured) raises ``RollbackUnavailable``: never delete or rewrite
    history without a record of what it was. An empty-thread point deletes the thread's
    checkpoints and returns None. ``RuntimeError`` if the new head does not read back as captured.
    """
    if point is None:
        raise RollbackUnavailable(
            "no rollback point was captured (the run stopped before capture, or capture failed); "
            "refusing to restore partial or empty history"
        )
    if point.mode != accessor.mode:
        raise CheckpointModeError(
            f"rollback point was captured in {point.mode} mode; this process runs in "
            f"{accessor.mode} mode"
        )
    if point.empty_thread:
        await accessor.checkpointer.adelete_thread(point.thread_id)
        return None
    assert point.checkpoint_id is not None
    if await accessor.araw_tuple(point.thread_id, point.checkpoint_id) is None:
        raise RollbackUnavailable(
            f"pre-run checkpoint {point.checkpoint_id!r} of thread {point.thread_id!r} "
            "no longer exists"
        )
    if point.tasks:
        restored = await accessor.aupdate(
            point.thread_id, None, as_node="__copy__", checkpoint_id=point.checkpoint_id
        )
    else:
        replayed = (accessor.delta_channels | {"messages"}) & point.values.keys()
        restored = await accessor.amutate(
            point.thread_id,
            {ch: Overwrite(list(point.values[ch])) for ch in replayed},
            label=RESTORE_NODE,
            checkpoint_id=point.checkpoint_id,
            metadata={RESTORED_FROM_KEY: point.checkpoint_id},
        )
    restored_id = (restored.get("configurable") or {}).get("checkpoint_id")
    if not isinstance(restored_id, str) or not restored_id:
        raise RuntimeError(
            f"restoring thread {point.thread_id!r} returned no checkpoint id: {restored!r}"
        )
    forked = await accessor.aget(point.thread_id, restored_id)
    if forked is None:
        raise RuntimeError(
            f"thread {point.thread_id!r}: restored checkpoint {restored_id!r} is missing"
        )
    await _reattach_pending_writes(accessor, point, restored_id, forked)
    after = await accessor.aget(point.thread_id, restored_id)
    if (
        after is None
        or after.values != point.values
        or sorted(t.name for t in after.tasks) != sorted(name for name, _ in point.tasks.values())
    ):
        raise RuntimeError(
            f"thread {point.thread_id!r}: restored checkpoint {restored_id!r} does not read back "
            "as the captured pre-run state"
        )
    return restored


async def _reattach_pending_writes(
    accessor: StateAccessor, point: RollbackPoint, restored_id: str, forked: StateSnapshot
) -> None:
    """Store the pre-run head's pending writes on the new head, under its own task ids.

    A write of a task the new head does not schedule keeps its id: LangGraph ignores it for
    scheduling (and snapshots delta channels rather than replay such writes), but it stays on
    record. Null-task writes (e.g. a ``Command(update=...)``) keep theirs by definition.
    """
    new_ids: dict[TaskKey, str] = {(t.name, t.path): t.id for t in forked.tasks}
    by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for write in point.pending_writes:
        task_id, channel, value = write
        if not isinstance(channel, str):
            raise TypeError(f"malformed pending write on thread {point.thread_id!r}: {write!r}")
        key = point.tasks.get(task_id)
        by_task[new_ids.get(key, task_id) if key else task_id].append((channel, value))
    target = checkpoint_config(point.thread_id, restored_id)
    for task_id, writes in by_task.items():
        await accessor.checkpointer.aput_writes(target, writes, task_id)


__all__ = [
    "RESTORED_FROM_KEY",
    "RESTORE_NODE",
    "RollbackPoint",
    "RollbackUnavailable",
    "capture_rollback_point",
    "restore_rollback_point",
]
