"""Driving one run's graph and publishing what it streams.

Kept apart from the worker's lifecycle (claim, finalize, persist): this is the one place a graph
is executed, and the one place its chunks are named (``mode`` or ``mode|namespace``) and handed to
the stream bridge.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agentkeel.harness.context import RunContext
from agentkeel.runtime.active import ActiveRun
from agentkeel.runtime.bridge import StreamBridge
from agentkeel.runtime.serialization import EventEncoder
from agentkeel.runtime.start_gate import StartGate


async def stream_graph(
    bridge: StreamBridge, active: ActiveRun, graph: Any, config: Any, context: RunContext, graph_input: Any,
    encoder: EventEncoder, start_gate: StartGate,
) -> None:
    """Execute the graph, publishing every chunk, within the run's wall-clock limit. ``encoder`` is
    the run's: its chunks are encoded there, once, to the bytes every observer gets (the worker
    closes it, giving its memo back to the process budget). Once its first chunk is out the run
    releases its hold on ``start_gate`` and from then on steps aside, at each chunk (that first
    one included: the runs started with it must not wait behind its next model turn), for runs
    being started.

    A ``TimeoutError`` raised because that limit expired is marked ``_agentkeel_run_timeout`` so the
    worker can tell the run's own timeout (status ``timeout``) from any other timeout inside it.
    """
    prepared = active.prepared
    run_id = active.record.run_id
    modes = list(dict.fromkeys("messages" if m == "messages-tuple" else m for m in prepared.stream_modes))
    started = False
    try:
        async with asyncio.timeout(prepared.timeout_s) as deadline:
            async for name, data in _chunks(graph, prepared, graph_input, config, context, modes):
                await bridge.publish_encoded(run_id, name, encoder.encode(data), coordinate=active.coordinate())
                if not started:
                    active.release_start()
                    started = True
                await start_gate.step_aside()
                if active.abort is not None:
                    # The abort's task.cancel() can be lost inside a library await: on Python
                    # 3.11 asyncio.wait_for returns the inner result instead of raising when both
                    # finish together (redis-py wraps every socket write in it). Honour it here.
                    raise asyncio.CancelledError
    except TimeoutError as exc:
        if deadline.expired():
            exc._agentkeel_run_timeout = True  # type: ignore[attr-defined]
        raise


async def _chunks(
    graph: Any, prepared: Any, graph_input: Any, config: Any, context: RunContext, modes: list[str]
) -> AsyncIterator[tuple[str, Any]]:
    """``(event name, data)`` for every chunk of the requested modes.

    The ``events`` mode is LangChain's ``astream_events`` (v2), which is not a LangGraph stream
    mode: the graph is then driven through ``astream_events``, whose root ``on_chain_stream``
    events carry the ordinary stream chunks, so both kinds are published from one execution.
    """
    graph_modes = [m for m in modes if m != "events"] or ["values"]
    kwargs = dict(
        context=context, stream_mode=graph_modes,
        subgraphs=prepared.request.stream_subgraphs, **prepared.stream_options,
    )
    if "events" not in modes:
        async for item in graph.astream(graph_input, config, **kwargs):
            yield _chunk_name(item)
        return
    async for event in graph.astream_events(graph_input, config, version="v2", **kwargs):
        if event["event"] == "on_chain_stream" and not event.get("parent_ids"):
            name, data = _chunk_name(event["data"]["chunk"])
            if name.split("|", 1)[0] in modes:
                yield name, data
        yield "events", event


class TaskEventSink:
    """Where a run's subagent progress goes: ``custom`` events of the run's stream, as LangGraph
    names them — ``custom|<namespace>`` when the run streams subgraphs (the child's own chunks carry
    the same namespace, so a client groups them), plain ``custom`` otherwise — and only when the
    run asked for the ``custom`` mode, like any other custom chunk."""

    def __init__(self, bridge: StreamBridge, active: ActiveRun, encoder: EventEncoder) -> None:
        self._bridge = bridge
        self._active = active
        self._run_id = active.record.run_id
        self._wanted = "custom" in active.prepared.stream_modes
        self._subgraphs = bool(active.prepared.request.stream_subgraphs)
        self._encoder = encoder  # the run's own: one memo per run, charged to the process budget

    async def task_event(self, namespace: str, payload: dict[str, Any]) -> None:
        if not self._wanted or self._active.fenced:
            return
        name = f"custom|{namespace}" if self._subgraphs and namespace else "custom"
        await self._bridge.publish_encoded(self._run_id, name, self._encoder.encode(payload),
                                           coordinate=self._active.coordinate())


def _chunk_name(item: tuple[Any, ...]) -> tuple[str, Any]:
    namespace, mode, chunk = item if len(item) == 3 else ((), *item)
    return (mode if not namespace else f"{mode}|{'|'.join(namespace)}"), chunk


__all__ = ["TaskEventSink", "stream_graph"]
