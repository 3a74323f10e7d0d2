"""Executing one claimed run, start to END marker.

The run arrives ``running`` under this attempt's lease (``claimer.py`` claimed it). The order is
the contract (and ``tests/runtime/test_runtime_*.py`` check it):

1. journal opened — inside the main ``try``, so even its failure ends in a terminal status and END;
2. a resumed attempt (``on_worker_lost: resume``) takes over what the lost one recorded: usage,
   stop reasons, its tool-call intents (never blindly repeated), its stream ids;
3. the graph is built and the materialized rollback point captured (messages and pending writes);
   if capture fails, a later rollback is *refused* rather than restoring partial or empty history;
4. workspace snapshot (hash, and content up to a size limit, of every file);
5. trusted runtime context installed (thread_id, run_id, user — never from the caller);
6. graph streamed, every chunk published;
7. ``finally``: processes killed, journal flushed, workspace changes recorded, (rollback applied),
   the delegations the run left open closed in its thread's state,
   usage and stop reasons persisted in one fenced write with the run's ``run.end`` and its thread's
   status (retried until it lands or the lease is lost), completion hooks run — and the END marker
   published last, only once the terminal record is durable.

Finalization is shielded: a second cancel (shutdown) cannot cut it short, so a run never ends
without its terminal status and END — unless its lease is lost, when it writes nothing at all and
the run's recovery (in whichever process) ends it instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphRecursionError
from langgraph.store.base import BaseStore

from agentkeel.config import KeelConfig
from agentkeel.harness.agents import TURNS_DONE_KEY, Harness
from agentkeel.harness.context import RunContext
from agentkeel.harness.middleware.llm_error_handling import ModelCallFailed
from agentkeel.harness.stop_reasons import StopReasonCollector
from agentkeel.harness.tool_replay import ToolReplay
from agentkeel.runtime.active import AbortRequest, ActiveRun
from agentkeel.runtime.bridge import StreamBridge
from agentkeel.runtime.checkpoints import (
    CheckpointModeError,
    RollbackUnavailable,
    StateAccessor,
    capture_rollback_point,
    mark_checkpoint_mode,
    restore_rollback_point,
)
from agentkeel.runtime.checkpoints.stamping import StampingSaver
from agentkeel.runtime.content_budget import ContentBudget
from agentkeel.runtime.delegations import close_run_delegations
from agentkeel.runtime.graph_stream import TaskEventSink, stream_graph
from agentkeel.runtime.journal import Journal
from agentkeel.runtime.journal_callbacks import JournalCallbackHandler
from agentkeel.runtime.metrics import RunMetrics
from agentkeel.runtime.records import (
    FIRST_ATTEMPT,
    Completion,
    CompletionHook,
    ControlPending,
    FencedOut,
    RunRecord,
    RunStatus,
)
from agentkeel.runtime.recovery import continue_stream, history_of
from agentkeel.runtime.redaction import redact, redact_json
from agentkeel.runtime.serialization import EventEncoder
from agentkeel.runtime.side_effects import prior_calls, recovered_notes
from agentkeel.runtime.snapshots import (
    ChangeTracker,
    WorkspaceSnapshot,
    acapture_snapshot,
    arestore_snapshot,
    diff_snapshots,
    restore_snapshot,
)
from agentkeel.runtime.start_gate import StartGate
from agentkeel.runtime.stores.base import JournalStore, RunStore
from agentkeel.runtime.thread_status import AFTER_RUN, settled_status
from agentkeel.runtime.usage import UsageAccumulator
from agentkeel.sandbox.exec import ProcessGroupRegistry
from agentkeel.sandbox.workspace import Workspace

log = logging.getLogger(__name__)

PERSIST_BACKOFF_S = (0.2, 5.0)  # retrying the completion write: initial, cap


@dataclass
class WorkerDeps:
    store: RunStore
    journal_store: JournalStore
    bridge: StreamBridge
    checkpointer: BaseCheckpointSaver
    harness: Harness
    config: KeelConfig
    owner: str
    checkpoint_mode: str = "full"
    completion_hooks: list[CompletionHook] = field(default_factory=list)
    # This process's run series: every journal record of a run executed here passes through it.
    metrics: RunMetrics = field(default_factory=RunMetrics)
    kv_store: BaseStore | None = None  # bound to the graph as ``store``; None keeps the graph's own
    # Re-runs whose tool calls the recording answers (thread id -> answerer; ``runtime/tool_replay.py``).
    tool_replays: dict[str, ToolReplay] = field(default_factory=dict)
    # The process's budget for run content held in memory (``limits.content_max_bytes``).
    content: ContentBudget = field(default_factory=ContentBudget)
    # Runs being started go first (``runtime/start_gate.py``); one per process, shared with admission.
    start_gate: StartGate = field(default_factory=StartGate)


@dataclass
class _RunState:
    """What the run accumulated, handed from the body to finalization."""

    status: RunStatus = RunStatus.error
    error: str | None = None
    error_detail: dict[str, Any] | None = None
    journal: Journal | None = None
    usage: UsageAccumulator = field(default_factory=UsageAccumulator)
    tracker: ChangeTracker = field(default_factory=ChangeTracker)
    processes: ProcessGroupRegistry = field(default_factory=ProcessGroupRegistry)
    snapshot: WorkspaceSnapshot | None = None
    workspace: Workspace | None = None
    accessor: StateAccessor | None = None
    rollback_point: Any = None
    rollback_error: str | None = None
    started: bool = False
    cancelled: bool = False
    collector: StopReasonCollector | None = None
    encoder: EventEncoder = field(default_factory=EventEncoder)  # the run's stream events, encoded once for every observer
    # How each delegated task ended, written by the subagent executor (see RunContext).
    delegation_outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)


async def execute_run(deps: WorkerDeps, active: ActiveRun) -> None:
    state = _RunState(encoder=EventEncoder(budget=deps.content))
    try:
        await _execute(deps, active, state)
    finally:  # the run's content goes back to the process budget however the run ended
        active.release_start()  # if it never published a chunk (the claimer covers a task that never ran)
        state.encoder.close()
        if state.snapshot is not None:
            deps.content.release(state.snapshot.content_bytes)


async def _execute(deps: WorkerDeps, active: ActiveRun, state: _RunState) -> None:
    state.collector = StopReasonCollector(
        next_seq=lambda: state.journal.next_seq() if state.journal else 0,
        emit=lambda entry: _emit_stop_reason(deps, active, state, entry),
    )
    active.executing = True
    try:
        if active.abort is not None:  # stopped between admission and start
            raise asyncio.CancelledError
        await _run_body(deps, active, state)
    except asyncio.CancelledError:
        _uncancel()
        state.status = RunStatus.interrupted
        state.cancelled = True
    except TimeoutError as exc:
        if getattr(exc, "_agentkeel_run_timeout", False):
            state.status = RunStatus.timeout
            state.error = f"run exceeded its wall-clock limit of {active.prepared.timeout_s:g} s"
            await state.collector.record(
                "timeout", "worker", detail=state.error, data={"limit_s": active.prepared.timeout_s}
            )
        else:
            await _fail(deps, active, state, exc)
    except GraphRecursionError as exc:
        await state.collector.record(
            "recursion_capped", "worker", detail=str(exc),
            data={"recursion_limit": active.prepared.config.get("recursion_limit")},
        )
        await _fail(deps, active, state, exc)
    except Exception as exc:
        await _fail(deps, active, state, exc)
    finally:
        active.finalizing = True
        finishing = asyncio.ensure_future(_finalize(deps, active, state))
        while not finishing.done():
            try:
                await asyncio.shield(finishing)
            except asyncio.CancelledError:
                _uncancel()
        finishing.result()


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        while task.cancelling():
            task.uncancel()


async def _run_body(deps: WorkerDeps, active: ActiveRun, state: _RunState) -> None:
    assert state.collector is not None  # set before the body runs
    record = active.record
    prepared = active.prepared
    state.journal = await Journal.open(
        deps.journal_store, record.run_id, record.thread_id, flush_ms=deps.config.limits.journal_flush_ms,
        attempt=record.attempt, observer=deps.metrics.journaled,
        empty=record.attempt == FIRST_ATTEMPT and active.resumed_from is None,
    )
    active.journal = state.journal
    state.started = True  # claimed: the record is ``running`` under this attempt's lease
    recovered: dict[str, str] = {}
    if active.resumed_from is not None:
        await _continue_lost_attempt(deps, active, state)
        await continue_stream(deps.bridge, record, deps.config.limits.stream_retention)
        recovered = recovered_notes(await prior_calls(deps.journal_store, record.run_id))
        # A fresh run's thread was marked busy by ``claim_next``'s own transaction; a takeover
        # (``RunStore.claim``) moves only the run, so its thread is marked here.
        await deps.store.set_thread_status(record.thread_id, "busy")
    state.journal.record(
        "run.start",
        {"assistant_id": record.assistant_id, "attempt": record.attempt, "owner": deps.owner,
         "model": prepared.assistant.model_name, "strategy": record.multitask_strategy.value,
         "resumed_from": active.resumed_from},
        caller="worker",
    )
    await deps.bridge.publish(record.run_id, "metadata", {"run_id": record.run_id, "attempt": record.attempt},
                              coordinate=active.coordinate())

    config = mark_checkpoint_mode(dict(prepared.config), deps.checkpoint_mode)  # type: ignore[arg-type]
    config["callbacks"] = [JournalCallbackHandler(state.journal, state.usage)]
    config.setdefault("metadata", {}).update({"run_id": record.run_id, "assistant_id": record.assistant_id})
    if active.resumed_from is not None:
        lead = state.usage.as_dict()["by_agent"].get("lead") or {}
        config["metadata"][TURNS_DONE_KEY] = int(lead.get("calls", 0))
    # Every checkpoint the run's graph (and its subagents' nested graphs) writes carries the coordinate.
    saver = StampingSaver(deps.checkpointer, state.journal)
    bound: dict[str, Any] = {"checkpointer": saver}
    if deps.kv_store is not None:
        bound["store"] = deps.kv_store
    chain = deps.harness.chain(prepared.assistant) if prepared.assistant.kind == "agent" else None
    built = await deps.harness.build(prepared.assistant, config, chain)
    graph = built.graph.copy(update=bound)
    if chain is not None:  # which guards wrapped which call, for the debugger and the ledger
        state.journal.record("chain.manifest", chain.manifest(), caller="worker")
    state.accessor = StateAccessor(graph, deps.checkpointer)
    try:
        state.rollback_point = await capture_rollback_point(  # its head read is the graph's first
            state.accessor, record.thread_id, functools.partial(saver.prime_head, record.thread_id))
    except CheckpointModeError:
        raise  # the thread was written in another channel mode: running it would corrupt it
    except Exception as exc:  # fail closed: rollback is refused later, never partial
        state.rollback_error = f"capture failed: {exc}"
        log.warning("run %s: rollback point capture failed: %s", record.run_id, exc)

    limits = deps.config.limits
    state.workspace = Workspace.for_thread(deps.config.data_path, record.thread_id)
    state.snapshot = await acapture_snapshot(
        state.workspace.root, limits.snapshot_max_file_bytes, limits.snapshot_max_total_bytes,
        deps.content.reserve, deps.content.release,
    )
    replay = deps.tool_replays.get(record.thread_id)  # a re-run: it also answers the recovered calls
    context = RunContext(
        thread_id=record.thread_id,
        run_id=record.run_id,
        workspace_root=state.workspace.root,
        user=prepared.request.user,
        attempt=record.attempt,
        bash_enabled=deps.config.tools.bash,
        bash_timeout_s=limits.bash_timeout_s,
        bash_output_cap=limits.bash_output_cap,
        bash_sandbox=deps.config.bash_sandbox(),
        workspace_tool_timeout_s=limits.workspace_tool_timeout_s,
        file_read_max_bytes=limits.file_read_max_bytes,
        file_write_max_bytes=limits.file_write_max_bytes,
        skills_root=deps.harness.skills_root,
        touches=state.tracker,
        processes=state.processes,
        stop_reasons=state.collector,
        journal=state.journal,
        usage=state.usage,
        recovered_calls={**recovered, **(replay.recovered_calls if replay is not None else {})},
        delegation_outcomes=state.delegation_outcomes,
        task_events=TaskEventSink(deps.bridge, active, state.encoder),
        tool_replay=replay,
        run_scope=built.scope,
        extra=prepared.caller_context,
    )
    graph_input = prepared.graph_input
    if active.resumed_from is not None and await _checkpointed_by(state.accessor, record):
        graph_input = None  # continue from the last checkpoint: LangGraph re-runs what was pending
    await stream_graph(deps.bridge, active, graph, config, context, graph_input, state.encoder, deps.start_gate)
    state.status = RunStatus.success


async def _fail(deps: WorkerDeps, active: ActiveRun, state: _RunState, exc: BaseException) -> None:
    state.status = RunStatus.error
    state.error = redact(f"{type(exc).__name__}: {exc}")  # a provider may quote the key it refused
    # A model call that cannot succeed says which model, what the provider said and which key to
    # check; any other failure says at least its type and message.
    state.error_detail = redact_json(
        exc.detail() if isinstance(exc, ModelCallFailed) else {"type": type(exc).__name__, "message": str(exc)}
    )
    log.info("run %s failed: %s", active.record.run_id, state.error)
    if state.journal:
        state.journal.record("error", {"type": type(exc).__name__, "message": str(exc),
                                       "detail": state.error_detail})
    await _publish(deps, active, "error", {"error": type(exc).__name__, "message": str(exc)})


async def _emit_stop_reason(deps: WorkerDeps, active: ActiveRun, state: _RunState, entry: dict[str, Any]) -> None:
    if active.fenced:  # this attempt lost the run: what it still records is nobody's to see
        return
    if state.journal:
        state.journal.record("stop_reason", entry, caller=entry.get("source"), seq=entry["seq"])
    await _publish(deps, active, "stop_reason", entry)


async def _publish(deps: WorkerDeps, active: ActiveRun, event: str, data: Any) -> None:
    try:
        await deps.bridge.publish(active.record.run_id, event, data, coordinate=active.coordinate())
    except Exception:
        log.exception("run %s: publishing %s failed", active.record.run_id, event)


async def _step(what: str, active: ActiveRun, coro: Awaitable[Any], bound_s: float) -> Any:
    """Run one finalization step within ``bound_s``; a failure is logged and never prevents the
    next ones."""
    try:
        async with asyncio.timeout(bound_s):
            return await coro
    except Exception:
        log.exception("run %s: finalization step %r failed", active.record.run_id, what)
        return None


async def _finalize(deps: WorkerDeps, active: ActiveRun, state: _RunState) -> None:
    record = active.record
    run_id = record.run_id
    bound = deps.config.limits.finalize_step_s
    state.processes.kill_all()
    journal = state.journal
    if active.fenced:  # lease lost: another attempt may own the run; write nothing more
        if journal is not None:
            journal.fence()
        return
    # No flush here: ``_persist`` flushes everything before the completion, and until then the
    # journal's timer bounds what a crash could lose, as during the run; one write, not two.
    if state.snapshot is not None and state.workspace is not None:
        await _step("workspace changes", active, _record_changes(deps, state), bound)
    rolled_back = False
    if active.abort is not None and active.abort.action == "rollback":
        # A run stopped before it started changed nothing: there is nothing to undo.
        rolled_back = not state.started or bool(
            await _step("rollback", active, _rollback(deps, active, state), bound)
        )
    if state.cancelled:
        await _record_cancellation(active, state, rolled_back)
    head = "idle"  # what the thread's state says once the run ends (its status, if it succeeded)
    if state.started and state.accessor is not None and not rolled_back:
        final = await _step("read final state", active, state.accessor.aget(record.thread_id), bound)
        if await _step("close delegations", active, close_run_delegations(
                state.accessor, record.thread_id, final, run_id, state.status, state.delegation_outcomes), bound
        ) and state.status is RunStatus.success:
            # The closing edit made a new head, and only a success settles by its head: read it again.
            final = await _step("read final state", active, state.accessor.aget(record.thread_id), bound)
        head = settled_status(final)
    finished = await _persist(deps, active, state, rolled_back, None if rolled_back else head)
    if finished is None:  # fenced out or the lease was lost: the record belongs to someone else
        if journal is not None:
            journal.fence()
        return
    active.record = finished
    if rolled_back:  # the thread is back where it was before the run: free
        await _step("delete rolled-back run", active, deps.store.delete_run(run_id), bound)
        await _step("thread status", active, deps.store.set_thread_status(
            record.thread_id, "idle", unless_running=True), bound)
    for hook in deps.completion_hooks:
        await _step(f"completion hook {getattr(hook, '__name__', hook)}", active, hook(finished), bound)
    # Last, and only once the terminal record is durable: END means "done, read the record".
    await _step("END marker", active, deps.bridge.publish_end(run_id), bound)


async def _persist(
    deps: WorkerDeps, active: ActiveRun, state: _RunState, rolled_back: bool, head: str | None,
) -> RunRecord | None:
    """Write the completion, retrying until it lands or the lease is lost.

    ``head``: the thread's status by its state after the run (``settled_status``); the thread
    settles in it, or in what the run's end implies (``AFTER_RUN``), in the completion's own
    transaction. None: the thread is left as it is (a rollback settles it after deleting the run).

    The journal's ``run.end`` is stored in the completion's own transaction: an attempt that dies
    or loses its lease before the completion lands leaves no end (its recovery's is the only
    one), and one that dies just after leaves no run without its end. Everything journaled before
    it is flushed first, so the journal has no hole below its end.
    A stored control request that this completion did not carry out was first (a cancel that
    raced the run's own end): the run then ends as the request says, and the write is retried.
    """
    assert state.collector is not None
    record = active.record
    journal = state.journal
    bound = deps.config.limits.finalize_step_s
    delay, cap = PERSIST_BACKOFF_S
    end_seq: int | None = None
    while not active.fenced:
        abort = active.abort
        completion = Completion(
            status=state.status, stop_reasons=state.collector.entries,
            usage=state.usage.as_dict(), error=state.error, error_detail=state.error_detail,
            acknowledges_control=abort is not None and abort.from_control,
        )
        end = None
        if journal is not None:
            await _step("journal flush", active, journal.flush(), bound)
            end = journal.unbuffered("run.end", {
                "status": state.status.value, "error": state.error, "usage": completion.usage,
                "rolled_back": rolled_back, "attempt": record.attempt,
                # The stream's last seq: a join after the stream is dropped learns what it missed.
                "stream_seq": max(deps.bridge.last_seq(record.run_id) or 0, record.stream_seq),
            }, seq=end_seq)
            end_seq = end.seq
        try:
            async with asyncio.timeout(bound):
                finished = await deps.store.finish(
                    record.run_id, record.attempt, completion, end, _settles_in(state.status, head),
                )
        except ControlPending as exc:
            if journal is not None and end_seq is not None:  # the seq reserved for the refused end
                journal.record("run.status", {"status": state.status.value, "refused": True,
                                              "reason": "a stored control request came first"}, seq=end_seq)
                end_seq = None
            await _carry_out_late_control(active, state, exc.control)
        except FencedOut as exc:
            # A newer attempt (or an earlier terminal write) owns the result; never overwrite it.
            log.warning("run %s attempt %s: completion refused: %s", record.run_id, record.attempt, exc)
            return None
        except Exception as exc:
            log.warning("run %s: writing the completion failed, retrying in %.1f s: %r",
                        record.run_id, delay, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)
        else:
            if journal is not None:
                await _step("journal close", active, journal.close(), bound)
            return finished
    return None


async def _carry_out_late_control(active: ActiveRun, state: _RunState, control: dict[str, Any]) -> None:
    """The run ended on its own just after a control request was stored: the request stands."""
    assert state.collector is not None
    abort = AbortRequest.from_stored(control)
    active.abort = abort
    code = abort.refused_code if abort.action == "rollback" else abort.code
    detail = abort.detail + (
        "; the run had already finished its work, so it was not rolled back"
        if abort.action == "rollback" else "; it arrived as the run was finishing"
    )
    state.status, state.error, state.cancelled = RunStatus.interrupted, None, True
    await state.collector.record(code, abort.source, detail=detail, data={"action": abort.action})


async def _continue_lost_attempt(deps: WorkerDeps, active: ActiveRun, state: _RunState) -> None:
    """A resumed attempt carries what the lost one spent and why it stopped (rebuilt from the
    journal), so budgets and the ledger count the whole run, not only this attempt."""
    assert state.collector is not None
    reasons, usage = await history_of(deps.journal_store, active.record.run_id)
    state.usage = usage
    state.collector.extend(reasons)


async def _checkpointed_by(accessor: StateAccessor | None, record: RunRecord) -> bool:
    """Whether the thread's latest checkpoint was written by this run (so it can continue)."""
    if accessor is None:
        return False
    snapshot = await accessor.aget(record.thread_id)
    return snapshot is not None and (snapshot.metadata or {}).get("run_id") == record.run_id


async def _record_cancellation(active: ActiveRun, state: _RunState, rolled_back: bool) -> None:
    assert state.collector is not None
    abort = active.abort
    if abort is None:  # cancelled without going through the manager (e.g. the loop shut down)
        await state.collector.record("cancelled", "worker", detail="the run's task was cancelled")
        return
    code, detail = abort.code, abort.detail
    if abort.action == "rollback" and not rolled_back:
        # Refused: the run stays, interrupted, with its checkpoints and files as they are.
        code = abort.refused_code
        detail = f"{detail}; rollback refused: {state.rollback_error or 'nothing to restore from'}"
    await state.collector.record(code, abort.source, detail=detail, data={"action": abort.action})


async def _record_changes(deps: WorkerDeps, state: _RunState) -> None:
    assert state.workspace is not None and state.snapshot is not None
    after = await acapture_snapshot(state.workspace.root, 0, 0)  # hashes are all a diff needs
    diffs = diff_snapshots(state.snapshot, after)
    seq_of = state.journal.seq_of_tool_call if state.journal else (lambda _call_id: None)
    for change in state.tracker.attribute(diffs, seq_of):
        if state.journal:
            state.journal.record("file.changed", change, caller="worker")


async def _rollback(deps: WorkerDeps, active: ActiveRun, state: _RunState) -> bool:
    """Undo the run's checkpoints and workspace changes; refuse rather than restore partially."""
    reason = None
    if state.rollback_point is None or state.accessor is None or state.snapshot is None or state.workspace is None:
        reason = state.rollback_error or "the run was stopped before its rollback point was complete"
    else:
        # Files whose content was too large to keep cannot be put back: refuse the whole rollback
        # (checkpoints included) rather than leave the workspace half-restored.
        preview = await asyncio.to_thread(
            restore_snapshot, state.workspace.root, state.snapshot, dry_run=True
        )
        if not preview.complete:
            reason = f"workspace files not restorable: {sorted(preview.unrestorable)}"
    if reason is None:
        assert state.accessor is not None  # a rollback point implies the accessor that captured it
        try:
            await restore_rollback_point(state.accessor, state.rollback_point)
        except RollbackUnavailable as exc:
            reason = str(exc)
    if reason is not None:
        state.rollback_error = reason
        _intervention(state, "rollback_refused", reason)
        return False
    assert state.workspace is not None and state.snapshot is not None
    report = await arestore_snapshot(state.workspace.root, state.snapshot)
    _intervention(
        state, "rolled_back",
        f"restored {len(report.restored)} file(s), deleted {len(report.deleted)}",
    )
    return True


def _intervention(state: _RunState, action: str, detail: str) -> None:
    if state.journal:
        state.journal.record("intervention", {"middleware": "worker", "action": action, "detail": detail}, caller="worker")


def _settles_in(status: RunStatus, head: str | None) -> str | None:
    """The status a thread settles in after a run that ended ``status``: for a success, what its
    state says (``head``); otherwise what that end implies."""
    if head is None:
        return None
    return head if status is RunStatus.success else AFTER_RUN.get(status, "idle")


__all__ = ["WorkerDeps", "execute_run"]
