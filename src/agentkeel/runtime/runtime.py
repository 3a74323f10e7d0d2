"""Composing the control plane from a configuration, and tearing it down in the right order.

One ``Runtime`` per process: the connection layer, stores, stream bridge, checkpointer, LangGraph
key-value store, assistants, harness and the run manager. Closing drains runs first (they still
need the checkpointer and stores to finalize honestly), then closes the key-value store, the
checkpointer, the bridge and, last, the connections they all shared.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore

from agentkeel.config import KeelConfig
from agentkeel.harness.agents import Harness
from agentkeel.runtime import redaction, tracing
from agentkeel.runtime.assistants import ensure_system_assistants
from agentkeel.runtime.bridge import StreamBridge, open_bridge
from agentkeel.runtime.checkpoints import StateAccessor, freeze_checkpoint_mode, open_checkpointer
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.content_budget import ContentBudget
from agentkeel.runtime.kvstore import open_kv_store
from agentkeel.runtime.manager import Executes, RunManager
from agentkeel.runtime.metrics import RunMetrics
from agentkeel.runtime.notify import open_notifier
from agentkeel.runtime.records import CompletionHook
from agentkeel.runtime.startup import StartupError
from agentkeel.runtime.stores.assistants import AssistantStore
from agentkeel.runtime.stores.base import JournalStore, RunStore
from agentkeel.runtime.stores.factory import open_stores
from agentkeel.runtime.worker import WorkerDeps


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Runtime:
    config: KeelConfig
    store: RunStore
    journal: JournalStore
    bridge: StreamBridge
    checkpointer: BaseCheckpointSaver
    harness: Harness
    manager: RunManager
    assistants: AssistantStore
    kv_store: BaseStore  # LangGraph's store, bound to every graph as ``store``
    metrics: RunMetrics  # this process's run series (``runtime/metrics.py``)
    # Run content this process holds in memory (snapshots, encoder memos): ``limits.content_max_bytes``.
    content: ContentBudget = field(default_factory=ContentBudget)
    _accessors: dict[str, StateAccessor] = field(default_factory=dict)

    async def accessor(self, assistant_id: str = "lead") -> StateAccessor:
        """The state accessor of threads run by ``assistant_id`` (its graph defines the schema).

        Built once per assistant: reading state needs the graph's channels, not its model, so the
        graph gets a placeholder model — a thread is created and read even while the assistant's
        provider model is unusable (package missing, key unset). Raises ``UnknownAssistant`` for an
        unconfigured id.
        """
        if assistant_id not in self._accessors:
            resolved = self.harness.resolve(assistant_id)
            graph = await self.harness.state_graph(resolved, {"configurable": {}, "metadata": {}})
            self._accessors[assistant_id] = StateAccessor(
                graph.copy(update={"checkpointer": self.checkpointer, "store": self.kv_store}),
                self.checkpointer,
            )
        return self._accessors[assistant_id]


@contextlib.asynccontextmanager
async def open_runtime(
    config: KeelConfig,
    *,
    harness: Harness | None = None,
    completion_hooks: list[CompletionHook] | None = None,
    drain_s: float = 5.0,
    executes: Executes = "all",
    metrics: RunMetrics | None = None,
) -> AsyncIterator[Runtime]:
    """``harness``: one already built from ``config`` (the CLI builds it first to report a broken
    config cleanly); by default it is built here. ``executes`` says which runs this process claims
    and executes (``RunManager``): ``all`` (a worker: it also recovers lost runs from the start),
    ``own`` (only the runs it admits), ``none`` (admits, controls and reads only). ``metrics``:
    where the runs executed here are counted (a new ``RunMetrics`` by default; ``runtime.metrics``)."""
    freeze_checkpoint_mode(config.checkpoint_mode)
    # The server's secrets never reach a record, a stream or a log line (redaction.py says where).
    redaction.install([*(m.api_key_env for m in config.models if m.api_key_env), *config.auth.secret_envs()])
    if harness is None:
        harness = Harness(config, config.checkpoint_mode)  # fails fast on a broken model or graph
    try:
        config.data_path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError("data_dir", f"cannot create {config.data_path}: {exc}") from None
    limits = config.limits
    metrics = metrics or RunMetrics()
    async with open_connections(config.db) as connections:
        store, journal, assistants = await open_stores(connections)
        bridge = open_bridge(
            config.stream, retention=limits.stream_retention, ttl_s=limits.stream_ttl_s,
            heartbeat_s=limits.stream_heartbeat_s, prefix=config.stream_prefix,
            max_subscribers=limits.stream_max_subscribers, end_grace_s=limits.stream_end_grace_s,
            run_max_bytes=limits.stream_run_max_bytes, max_bytes=limits.stream_max_bytes,
        )
        try:
            await ensure_system_assistants(assistants, harness.assistant_ids)
            async with (
                open_checkpointer(connections) as checkpointer,
                open_kv_store(connections) as kv_store,
            ):
                content = ContentBudget(limits.content_max_bytes)
                deps = WorkerDeps(
                    store=store, journal_store=journal, bridge=bridge, checkpointer=checkpointer,
                    harness=harness, config=config, owner=worker_id(),
                    checkpoint_mode=config.checkpoint_mode,
                    completion_hooks=[metrics.finished, tracing.completion_hook(journal), *(completion_hooks or [])],
                    kv_store=kv_store,
                    metrics=metrics, content=content,
                )
                manager = RunManager(
                    deps, harness, limits, open_notifier(connections, store), executes=executes
                )
                metrics.bind(lambda: manager.in_flight, lambda: bridge.publish_failures)
                try:
                    await manager.start()
                    yield Runtime(
                        config, store, journal, bridge, checkpointer, harness, manager, assistants,
                        kv_store, metrics, content,
                    )
                finally:
                    await manager.shutdown(drain_s)
        finally:
            await bridge.close()
