"""The state schemas an agent graph is compiled with, per checkpoint channel mode.

``full`` stores the whole message list in every checkpoint that changes it, so a thread of *n*
messages costs O(n) bytes per step and O(n²) in total. ``delta`` stores only each step's new
messages (as checkpoint writes) plus a periodic full snapshot, and rebuilds the list on read by
replaying the writes since the last snapshot through the reducer. Both modes hold the same
values; what differs is the bytes on disk and that delta checkpoints can only be read back through
a graph whose ``messages`` channel is the same ``DeltaChannel`` (see
``agentkeel.runtime.checkpoints``, which enforces that).

The mode is a per-process constant fixed at start-up; this module only maps it to a schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from langchain.agents import AgentState
from langchain.agents.middleware.types import OmitFromInput
from langchain_core.messages import AnyMessage, BaseMessage, RemoveMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

from agentkeel.harness.durable import (
    Compaction,
    DelegationEntry,
    OriginalRequest,
    SkillEntry,
    delegations_delta,
    merge_compaction,
    merge_delegations,
    merge_original_request,
    merge_skills,
    skills_delta,
)

CheckpointMode = Literal["full", "delta"]
CHECKPOINT_MODES: tuple[CheckpointMode, ...] = ("full", "delta")

# A full snapshot of the message list every 200 supersteps that wrote messages. Trade-off:
# * bytes: a snapshot costs the whole history once, |history|/200 per message write amortized —
#   under the size of a step's own new messages until a thread passes ~200 messages, and 1/200 of
#   what full mode stores (the whole history at every superstep) beyond that;
# * reads: rebuilding the list replays at most 199 writes; on SQLite, reading a 400-message head
#   just before a snapshot takes ~35 ms against ~20 ms for a full-mode read
#   (``benchmarks/checkpoint_bytes.py --messages 398``), small next to a model call. LangGraph's
#   default of 100 halves that replay but doubles the snapshot share of the bytes.
# An agent turn writes messages in 2-4 supersteps (input, model, tools, model), so a snapshot lands
# every ~50-100 turns.
MESSAGES_SNAPSHOT_FREQUENCY = 200


def merge_message_batches(state: Sequence[AnyMessage], writes: Sequence[Any]) -> list[AnyMessage]:
    """Fold ``add_messages`` over a batch of channel writes.

    ``DeltaChannel`` replays stored writes in batches whose boundaries depend on where snapshots
    fell, so its reducer must satisfy ``r(r(s, xs), ys) == r(s, xs + ys)``. A left fold of
    ``add_messages`` does by construction, and keeps exactly the semantics the full-mode channel has
    (id-based replacement, ``RemoveMessage``, remove-all), so both modes build identical lists.
    LangGraph gives every message written to a delta channel a stable id before storing it, so
    replay never invents new ids.

    Replaying a long tail of writes one ``add_messages`` call each re-indexes the whole list per
    write (O(history × writes)). Without removals one call over the concatenated writes gives the
    same list — ``add_messages`` replaces by id or appends, message by message, indexing what it
    appended — so that is done instead; any removal takes the literal fold.
    """
    flat: list[Any] = [m for w in writes for m in (w if isinstance(w, list) else [w])]
    merged: list[Any] = list(state)
    if all(isinstance(m, BaseMessage) and not isinstance(m, RemoveMessage) for m in flat):
        return add_messages(merged, flat)  # type: ignore[return-value]
    for write in writes:
        merged = add_messages(merged, write)  # type: ignore[assignment]
    return merged


def _delta_messages_channel() -> DeltaChannel[list[AnyMessage]]:
    return DeltaChannel(merge_message_batches, snapshot_frequency=MESSAGES_SNAPSHOT_FREQUENCY)


# A ledger or skill list changes by one entry at a time; in delta mode it is stored as such.
DURABLE_SNAPSHOT_FREQUENCY = 50


class FullAgentState(AgentState):
    """``AgentState`` plus the durable channels (:mod:`agentkeel.harness.durable`), stored whole."""

    delegations: NotRequired[Annotated[list[DelegationEntry], OmitFromInput, merge_delegations]]
    skills: NotRequired[Annotated[list[SkillEntry], OmitFromInput, merge_skills]]
    compaction: NotRequired[Annotated[Compaction | None, OmitFromInput, merge_compaction]]
    original_request: NotRequired[Annotated[OriginalRequest | None, OmitFromInput, merge_original_request]]


class DeltaAgentState(FullAgentState):
    """The agent state whose ``messages``, ``delegations`` and ``skills`` store per-step deltas.

    ``create_agent`` merges middleware state schemas *before* the one passed as ``state_schema``,
    so this ``messages`` annotation wins over the plain ``add_messages`` one middleware inherit
    from ``AgentState``. The small ``compaction`` and ``original_request`` values are stored whole
    in both modes (their reducers are batching-invariant all the same).
    """

    messages: Annotated[list[AnyMessage], _delta_messages_channel()]
    delegations: NotRequired[Annotated[
        list[DelegationEntry],
        DeltaChannel(delegations_delta, snapshot_frequency=DURABLE_SNAPSHOT_FREQUENCY),
        OmitFromInput,
    ]]
    skills: NotRequired[Annotated[
        list[SkillEntry], DeltaChannel(skills_delta, snapshot_frequency=DURABLE_SNAPSHOT_FREQUENCY), OmitFromInput,
    ]]


class FullMessagesState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class DeltaMessagesState(TypedDict):
    messages: Annotated[list[AnyMessage], _delta_messages_channel()]


def _checked(mode: str) -> CheckpointMode:
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint mode must be one of {CHECKPOINT_MODES}, got {mode!r}")
    return mode


def agent_state_schema(mode: CheckpointMode) -> type[AgentState]:
    """The ``state_schema`` to pass to ``langchain.agents.create_agent`` in ``mode``."""
    return FullAgentState if _checked(mode) == "full" else DeltaAgentState


def messages_state_schema(mode: CheckpointMode) -> type:
    """A schema with only ``messages``, for plain ``StateGraph``s (tests, benchmarks)."""
    return FullMessagesState if _checked(mode) == "full" else DeltaMessagesState


__all__ = [
    "CHECKPOINT_MODES",
    "MESSAGES_SNAPSHOT_FREQUENCY",
    "CheckpointMode",
    "DeltaAgentState",
    "FullAgentState",
    "agent_state_schema",
    "merge_message_batches",
    "messages_state_schema",
]
