"""The process-wide checkpoint channel mode, and telling which mode wrote a checkpoint.

Why frozen per process: the mode decides the schema every graph of the process is compiled with,
and a thread's checkpoints are only readable by a graph of the mode that wrote them (a full-mode
graph sees a delta thread's messages as missing or stale). Switching mode while runs are in flight
would mix both on one thread, so the first ``freeze_checkpoint_mode`` wins and any later attempt to
change it is an error, not a silent reconfiguration. All processes sharing a database must agree;
the marker below is what lets a mismatched process notice.

Why a marker *and* LangGraph's counters: ``counters_since_delta_snapshot`` is only present on
delta checkpoints written since the last snapshot (a snapshot checkpoint resets it), and it is a
beta field. The runtime therefore stamps every checkpoint it causes with
``agentkeel_checkpoint_mode`` (through the run config's metadata, which every saver copies into
checkpoint metadata) and treats either signal as "written in delta mode".
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig

from agentkeel.harness.state import CHECKPOINT_MODES, CheckpointMode

MODE_METADATA_KEY = "agentkeel_checkpoint_mode"
_DELTA_COUNTERS_KEY = "counters_since_delta_snapshot"
_DELTA_CHANNEL = "messages"


class CheckpointModeError(RuntimeError):
    """The checkpoint mode was changed after start-up, or a thread was written in another mode."""


_lock = threading.Lock()
_frozen: CheckpointMode | None = None


def freeze_checkpoint_mode(mode: CheckpointMode) -> CheckpointMode:
    """Fix the process's mode. Idempotent for the same mode; a different mode raises."""
    global _frozen
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint mode must be one of {CHECKPOINT_MODES}, got {mode!r}")
    with _lock:
        if _frozen is None:
            _frozen = mode
        elif _frozen != mode:
            raise CheckpointModeError(
                f"checkpoint mode is frozen to {_frozen!r} for this process; changing it to "
                f"{mode!r} requires a restart (and every process sharing the database must agree)"
            )
        return _frozen


def frozen_checkpoint_mode() -> CheckpointMode | None:
    """The process's mode, or None before start-up froze it."""
    return _frozen


def mark_checkpoint_mode(config: RunnableConfig, mode: CheckpointMode) -> RunnableConfig:
    """``config`` with the mode marker in its metadata, so every checkpoint it causes carries it.

    Returns a copy; the caller's config and its metadata dict are left untouched.
    """
    return {**config, "metadata": {**(config.get("metadata") or {}), MODE_METADATA_KEY: mode}}


def written_in_delta_mode(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a checkpoint with this metadata needs delta replay to read its messages."""
    if not metadata:
        return False
    counters = metadata.get(_DELTA_COUNTERS_KEY) or {}
    return metadata.get(MODE_METADATA_KEY) == "delta" or _DELTA_CHANNEL in counters


def ensure_readable(
    mode: CheckpointMode, thread_id: str, metadata: Mapping[str, Any] | None
) -> None:
    """Fail closed when a full-mode process meets a checkpoint written in delta mode.

    The other direction is fine: a delta channel reads a full checkpoint's stored list as its
    starting value, which is how a deployment migrates from full to delta.
    """
    if mode == "full" and written_in_delta_mode(metadata):
        raise CheckpointModeError(
            f"thread {thread_id!r} was checkpointed in delta mode but this process runs in full "
            "mode; its messages cannot be read without delta replay (restart with "
            "checkpoint_mode: delta)"
        )


__all__ = [
    "MODE_METADATA_KEY",
    "CheckpointModeError",
    "ensure_readable",
    "freeze_checkpoint_mode",
    "frozen_checkpoint_mode",
    "mark_checkpoint_mode",
    "written_in_delta_mode",
]
