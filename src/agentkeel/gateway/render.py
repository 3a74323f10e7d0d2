"""From bridge events to the SSE frames of the stream modes one client asked for.

The worker publishes every event of a run once, named by LangGraph mode (``values``,
``messages``, ``custom``..., ``|ns`` suffixed for subgraphs) plus AgentKeel's own ``metadata``,
``error`` and ``stop_reason``. Each SSE response renders them for its own ``stream_mode`` list:

* ``messages-tuple``: ``messages`` frames, the raw ``[chunk, metadata]`` pairs;
* ``messages``: ``messages/metadata`` + ``messages/partial`` (+ ``messages/complete``) frames;
* in both, file-tool argument deltas are batched (``toolargs``) before either form is made;
* any other mode: its events unchanged, matched on the name before ``|``;
* ``metadata``, ``error``, ``stop_reason`` and ``gap`` always (clients ignore names they do not
  know); anything else the client did not ask for is dropped.
"""

from __future__ import annotations

from typing import Any

from agentkeel.gateway.messages import MESSAGES, Frame, MessagesModeTransformer
from agentkeel.gateway.toolargs import DEFAULT_POLICY, BatchPolicy, ToolArgBatcher
from agentkeel.runtime.bridge.base import GAP_EVENT

MESSAGES_TUPLE = "messages-tuple"
ALWAYS_SENT = frozenset({"metadata", "error", "stop_reason", GAP_EVENT})
"""Events every client gets: run identity, failures, why the run stopped, and missed events."""

VALUES = "values"


class ModeRenderer:
    """Renders one SSE response: ``feed`` each bridge event in order, ``flush`` at the end or on error.

    ``policy`` chooses how file-tool arguments are batched; ``None`` sends every chunk as it comes
    (the benchmark's baseline).
    """

    def __init__(self, modes: list[str], policy: BatchPolicy | None = DEFAULT_POLICY) -> None:
        self._tuples = MESSAGES_TUPLE in modes
        self._messages = MessagesModeTransformer() if MESSAGES in modes else None
        self._modes = frozenset(modes) - {MESSAGES, MESSAGES_TUPLE}
        wants_messages = self._tuples or self._messages is not None
        self._batcher = ToolArgBatcher(policy) if wants_messages and policy is not None else None

    @property
    def holding(self) -> bool:
        """Whether argument text fed earlier is still held back. While it is, a client resuming
        after the current event id would never get that text: the SSE layer should put ids only
        on frames sent while nothing is held."""
        return self._batcher is not None and self._batcher.holding

    def reads(self, event: str) -> bool:
        """Whether ``feed`` looks into this event's data (``messages``); any other event's data is
        passed on untouched, so the SSE layer hands it over still encoded."""
        return event.partition("|")[0] == MESSAGES and (self._tuples or self._messages is not None)

    def feed(self, event: str, data: Any) -> list[Frame]:
        """The frames this event becomes for this client, after any held ones it must follow."""
        base = event.partition("|")[0]
        if base == MESSAGES:
            if not self._tuples and self._messages is None:
                return []
            return self._render(self._batcher.push(event, data) if self._batcher else [(event, data)])
        visible = base in self._modes or base in ALWAYS_SENT
        frames: list[Frame] = []
        if self._batcher is not None and base == VALUES:  # a step ended, seen or not by this client
            frames = self._render(self._batcher.boundary(event[len(base) :]))
        elif self._batcher is not None and visible:
            frames = self._render(self._batcher.flush())
        if visible:
            frames.append((event, data))
        return frames

    def flush(self) -> list[Frame]:
        """Whatever is still held: call when the stream ends, normally or not, before the last frame."""
        return self._render(self._batcher.flush()) if self._batcher else []

    def _render(self, raw: list[Frame]) -> list[Frame]:
        """Raw ``messages`` events in the forms the client asked for, tuple form first.

        A ``messages/partial`` followed at once by another of the same message is dropped: both
        go out in the same instant and the second contains the first (a flushed batch directly
        before the message's last chunk would otherwise send the whole message twice).
        """
        frames: list[Frame] = []
        for event, data in raw:
            if self._tuples:
                frames.append((event, data))
            if self._messages is not None:
                rendered = self._messages.feed(event, data)
                if frames and rendered and _same_partial(frames[-1], rendered[0]):
                    frames.pop()
                frames.extend(rendered)
        return frames


def _same_partial(first: Frame, second: Frame) -> bool:
    return (
        first[0] == second[0]
        and first[0].startswith("messages/partial")
        and first[1][0].get("id") == second[1][0].get("id")
    )
