"""Operations on a whole thread, across the run store, the checkpointer and the workspace.

A thread lives in three places: its record (and runs, and journal) in the run store, its
checkpoints in LangGraph's saver, and its files under ``<data_dir>/threads/<thread_id>``. Deleting
or copying it must cover all three, so those operations live here once, for every caller (the
gateway's thread routes, temporary threads of stateless runs).
"""

from __future__ import annotations

import asyncio
import shutil
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from agentkeel.runtime.assistants import assistant_key
from agentkeel.runtime.records import ThreadRecord
from agentkeel.runtime.stores.base import RunStore
from agentkeel.runtime.thread_status import settled_status
from agentkeel.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from agentkeel.runtime.runtime import Runtime

DEFAULT_GRAPH = "lead"
LIST_PAGE = 500


def thread_dir(runtime: Runtime, thread_id: str) -> Path:
    """The thread's directory (its workspace and anything else kept per thread).

    ``ValueError`` for an id that is not a safe directory name -- no such thread can exist, since
    runs and thread creation refuse those ids.
    """
    return Workspace.for_thread(runtime.config.data_path, thread_id).root.parent


def is_valid_thread_id(thread_id: str) -> bool:
    try:
        Workspace.for_thread(Path("."), thread_id)
    except ValueError:
        return False
    return True


async def graph_of_thread(runtime: Runtime, thread: ThreadRecord) -> str:
    """The configured graph whose schema the thread's checkpoints follow.

    Looked up in order: the thread's ``graph_id`` metadata (the SDK's ``threads.create(graph_id=)``),
    its ``assistant_id`` metadata (a name or an assistant UUID), the assistant of its newest run;
    else ``lead``.
    """
    known = runtime.harness.assistant_ids
    for key in ("graph_id", "assistant_id"):
        value = thread.metadata.get(key)
        if not isinstance(value, str):
            continue
        if value in known:
            return value
        found = await runtime.assistants.get(assistant_key(value))
        if found is not None and found.graph_id in known:
            return found.graph_id
    newest = await runtime.store.list_runs(thread.thread_id, limit=1)
    if newest and newest[0].assistant_id in known:
        return newest[0].assistant_id
    return DEFAULT_GRAPH


async def list_all_threads(store: RunStore) -> list[ThreadRecord]:
    """Every thread record, read page by page (the store offers no filtered query)."""
    found: dict[str, ThreadRecord] = {}
    offset = 0
    while True:
        page = await store.list_threads(limit=LIST_PAGE, offset=offset)
        for thread in page:  # a thread created meanwhile shifts the pages: keep the first sighting
            found.setdefault(thread.thread_id, thread)
        if len(page) < LIST_PAGE:
            return list(found.values())
        offset += LIST_PAGE


async def stop_thread_runs(runtime: Runtime, thread_id: str, detail: str) -> None:
    """Cancel every pending or running run of the thread and wait until each has finalized,
    wherever it executes (a run whose owner died is finalized by recovery within its lease)."""
    for record in await runtime.store.active_runs(thread_id):
        await runtime.manager.cancel(record.run_id, "interrupt", detail=detail)
        await runtime.manager.wait(record.run_id)


async def delete_thread(runtime: Runtime, thread_id: str) -> bool:
    """Cancel the thread's runs, then delete its record, runs, journal, checkpoints and files.

    Cancel-then-delete, like the official server, rather than refusing while a run is active: a
    client deleting a thread wants it gone. False when there was no thread record.
    """
    await stop_thread_runs(runtime, thread_id, "the thread was deleted")
    found = await runtime.store.delete_thread(thread_id)
    await runtime.checkpointer.adelete_thread(thread_id)
    await asyncio.to_thread(shutil.rmtree, thread_dir(runtime, thread_id), ignore_errors=True)
    return found


async def copy_thread(
    runtime: Runtime, source: ThreadRecord, target_id: str, metadata: dict[str, Any] | None = None
) -> ThreadRecord:
    """A new thread ``target_id`` with the source's metadata (or ``metadata``; plus ``graph_id``),
    checkpoints and files.

    The record is written last, so a failed copy leaves no thread behind (its partial checkpoints
    and files are removed). A copy taken while the source runs has no run of its own: its status is
    what its copied state says (``interrupted`` or ``idle``).
    """
    target_dir = thread_dir(runtime, target_id)
    try:
        await copy_checkpoints(runtime.checkpointer, source.thread_id, target_id)
        source_dir = thread_dir(runtime, source.thread_id)
        if source_dir.is_dir():
            await asyncio.to_thread(shutil.copytree, source_dir, target_dir, symlinks=True)
        graph_id = await graph_of_thread(runtime, source)
        status = source.status
        if status == "busy":
            status = settled_status(await (await runtime.accessor(graph_id)).aget(target_id))
        # The copy has none of the source's runs to tell its graph by, so it names it.
        await runtime.store.upsert_thread(target_id, {"graph_id": graph_id, **(source.metadata if metadata is None else metadata)})
        await runtime.store.set_thread_status(target_id, status)
    except BaseException:
        await runtime.store.delete_thread(target_id)
        await runtime.checkpointer.adelete_thread(target_id)
        await asyncio.to_thread(shutil.rmtree, target_dir, ignore_errors=True)
        raise
    copied = await runtime.store.get_thread(target_id)
    assert copied is not None
    return copied


async def copy_checkpoints(saver: BaseCheckpointSaver, source_id: str, target_id: str,
                           until: str | None = None) -> None:
    """Copy every checkpoint (all namespaces) and its pending writes to another thread id —
    with ``until``, only those up to that checkpoint id (the thread as it was then: a re-run of a
    later run starts there, ``runtime/replay_thread.py``).

    The savers implement no ``acopy_thread``, so the copy is made with their public API. The
    listing is read completely before writing (the SQLite saver holds its connection lock while a
    listing is open), then written oldest first. Checkpoint ids are kept: they order history and
    link parents, and they are only unique per thread. Each checkpoint is written with all of its
    channel versions as new, so savers that store channel values separately (the PostgreSQL and
    in-memory savers) store every value the copy needs; delta channels find their whole chain.
    """
    tuples = [t async for t in saver.alist({"configurable": {"thread_id": source_id}})]
    for tup in sorted(tuples, key=lambda t: t.checkpoint["id"]):
        if until is not None and tup.checkpoint["id"] > until:
            continue  # written after it (checkpoint ids grow with time)
        configurable: dict[str, Any] = {
            "thread_id": target_id,
            "checkpoint_ns": tup.config["configurable"].get("checkpoint_ns", ""),
        }
        if tup.parent_config is not None:
            configurable["checkpoint_id"] = tup.parent_config["configurable"]["checkpoint_id"]
        saved = await saver.aput(
            {"configurable": configurable}, tup.checkpoint, tup.metadata,
            dict(tup.checkpoint["channel_versions"]),
        )
        by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in tup.pending_writes or ():
            by_task[task_id].append((channel, value))
        for task_id, writes in by_task.items():
            await saver.aput_writes(saved, writes, task_id)
