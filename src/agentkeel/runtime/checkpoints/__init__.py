"""Checkpoint access for the runtime: savers, the channel mode, state reads/writes, rollback.

How the worker uses it, in order:

1. at start-up: ``freeze_checkpoint_mode(config.checkpoint_mode)``, then
   ``async with open_checkpointer(connections) as saver`` on the connection layer;
2. per run: build the graph with ``agent_state_schema(mode)``, wrap it in
   ``StateAccessor(graph, saver)``, and ``capture_rollback_point(accessor, thread_id)`` before the
   graph runs (``CheckpointModeError`` there means: do not run);
3. run the graph with ``mark_checkpoint_mode(config, mode)`` so each checkpoint carries the mode;
4. on a rollback: ``restore_rollback_point(accessor, point)``; ``RollbackUnavailable`` means
   refuse the rollback and leave the thread as it is.
"""

from agentkeel.harness.state import CheckpointMode
from agentkeel.runtime.checkpoints.accessor import MUTATION_NODE, StateAccessor, checkpoint_config
from agentkeel.runtime.checkpoints.mode import (
    MODE_METADATA_KEY,
    CheckpointModeError,
    ensure_readable,
    freeze_checkpoint_mode,
    frozen_checkpoint_mode,
    mark_checkpoint_mode,
    written_in_delta_mode,
)
from agentkeel.runtime.checkpoints.rollback import (
    RESTORE_NODE,
    RESTORED_FROM_KEY,
    RollbackPoint,
    RollbackUnavailable,
    capture_rollback_point,
    restore_rollback_point,
)
from agentkeel.runtime.checkpoints.savers import open_checkpointer

__all__ = [
    "MODE_METADATA_KEY",
    "MUTATION_NODE",
    "RESTORED_FROM_KEY",
    "RESTORE_NODE",
    "CheckpointMode",
    "CheckpointModeError",
    "RollbackPoint",
    "RollbackUnavailable",
    "StateAccessor",
    "capture_rollback_point",
    "checkpoint_config",
    "ensure_readable",
    "freeze_checkpoint_mode",
    "frozen_checkpoint_mode",
    "mark_checkpoint_mode",
    "open_checkpointer",
    "restore_rollback_point",
    "written_in_delta_mode",
]
