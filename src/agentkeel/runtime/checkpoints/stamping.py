"""Stamping the run coordinate into the metadata of every checkpoint a run writes.

Why a wrapper around the run's saver and not the run config's metadata: LangGraph copies the
config's metadata into each checkpoint once per run, but the coordinate moves — every checkpoint
is written at another superstep, after another stretch of the journal. The wrapper is bound to one
run's graph (``graph.copy(update={"checkpointer": ...})`` in the worker), so subagents' nested
graphs, which inherit their parent's checkpointer, are stamped too; everything else is passed
through to the process's saver untouched.

The stamp, under :data:`COORDINATE_KEY`: ``{run_id, attempt, step, journal_seq}`` — ``step`` the
checkpoint's own superstep (LangGraph's ``metadata["step"]``) and ``journal_seq`` the last journal
seq recorded before the next superstep began, i.e. the journal the checkpoint's state reflects.
``runtime/timeline.py`` aligns checkpoints, journal and stream by it.

The wrapper also answers the run graph's first read of the thread's head, once, with the tuple
the worker read just before for the rollback point (``prime_head``): the run owns the thread, so
nothing can have written in between, and the start of a run is one read shorter (a round trip on
PostgreSQL, on the way to its first event).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from agentkeel.runtime.journal import Journal

COORDINATE_KEY = "agentkeel_coordinate"

_PASSED_THROUGH = (
    "get", "get_tuple", "list", "put_writes", "delete_thread", "delete_for_runs", "copy_thread",
    "prune", "aget", "alist", "aput_writes", "adelete_thread", "adelete_for_runs",
    "acopy_thread", "aprune", "get_delta_channel_history", "aget_delta_channel_history",
    "get_next_version", "with_allowlist",
)


class StampingSaver(BaseCheckpointSaver[Any]):
    """``inner`` with every ``put`` stamped by ``journal``'s coordinate."""

    def __init__(self, inner: BaseCheckpointSaver[Any], journal: Journal) -> None:
        self.inner = inner
        self.serde = inner.serde
        self._journal = journal
        self._primed: tuple[str, CheckpointTuple | None] | None = None

    def prime_head(self, thread_id: str, head: CheckpointTuple | None) -> None:
        """The next read of ``thread_id``'s head in the root namespace gets ``head`` (None: the
        thread has no checkpoint) without asking ``inner``; once."""
        self._primed = (thread_id, head)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        given = config.get("configurable", {})
        primed, self._primed = self._primed, None
        if (
            primed is not None and primed[0] == given.get("thread_id")
            and not given.get("checkpoint_ns") and not given.get("checkpoint_id")
        ):
            return primed[1]
        return await self.inner.aget_tuple(config)

    @property
    def config_specs(self) -> list[Any]:
        return list(self.inner.config_specs)

    def stamp(self, metadata: CheckpointMetadata) -> CheckpointMetadata:
        step = metadata.get("step")
        journal = self._journal
        seq = journal.seq_through_step(step) if isinstance(step, int) else journal.last_seq
        coordinate = {"run_id": journal.run_id, "attempt": journal.attempt, "step": step, "journal_seq": seq}
        stamped: dict[str, Any] = {**metadata, COORDINATE_KEY: coordinate}
        return cast(CheckpointMetadata, stamped)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return self.inner.put(config, checkpoint, self.stamp(metadata), new_versions)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await self.inner.aput(config, checkpoint, self.stamp(metadata), new_versions)


def _pass_through(name: str) -> Callable[..., Any]:
    def method(self: StampingSaver, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


for _name in _PASSED_THROUGH:
    setattr(StampingSaver, _name, _pass_through(_name))


__all__ = ["COORDINATE_KEY", "StampingSaver"]
