"""Where a recorded run started and ended, and a fresh thread set up as it was when the run began.

Why: a run that was not its thread's first started from the state the earlier runs left — the
thread's history (its checkpoint before the run) and its workspace's files. A re-run on an empty
thread would answer another conversation. So the re-run's new thread gets the checkpoint the run
started from (with everything before it: the copy ends there, ``threads.copy_checkpoints``) and the
workspace's files as they were then; and the recording it is compared with is the run's own — its
state at its last checkpoint, its files as it left them — not the thread's as later runs left it.

The files before the run are rebuilt from the workspace as it is now: each later run's
``file.changed`` records (newest run first) say which paths it changed and their hash before it, and
the run's own records the hashes before it. A path the runs did not change is copied as it is; a
path added since is left out; a path changed since whose content now is not the content it had then
cannot be rebuilt: the journal keeps the hashes of changed files, not their content. Such a path is
*not reproducible* — left out of the new workspace and out of the comparison, and reported as such,
not as a divergence. Files put in the workspace between runs by no run (an upload) are not told from
the earlier runs' files.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkeel.runtime.checkpoints import checkpoint_config
from agentkeel.runtime.records import RunRecord
from agentkeel.runtime.stores.base import JournalEvent
from agentkeel.runtime.threads import copy_checkpoints
from agentkeel.runtime.timeline import checkpoint_items
from agentkeel.sandbox.workspace import Workspace, to_relpath

THREAD_RUNS_MAX = 1000  # the runs of one thread read to rebuild its files before a run


class ReplayError(ValueError):
    """The run cannot be re-run or forked as asked (the message says why)."""


@dataclass
class RunBounds:
    """Where ``record`` started and ended, and the workspace's files (path -> sha256) around it."""

    record: RunRecord
    start: str | None  # the checkpoint it started from; None: it started its thread
    last: str | None  # its own last root checkpoint; None: it wrote none
    files_before: dict[str, str] = field(default_factory=dict)
    files_after: dict[str, str] = field(default_factory=dict)
    not_reproducible: list[str] = field(default_factory=list)  # filled by ``seed_thread``

    @property
    def first_of_thread(self) -> bool:
        return self.start is None


async def run_bounds(runtime: Any, record: RunRecord) -> RunBounds:
    """The run's start and last checkpoints and its files before and after it."""
    roots = [c for c in await checkpoint_items(runtime.checkpointer, record) if not c.data["namespace"]]
    start: str | None = None
    if roots:
        first = min(roots, key=lambda c: str(c.ident))  # checkpoint ids grow with time
        tup = await runtime.checkpointer.aget_tuple(checkpoint_config(record.thread_id, str(first.ident)))
        parent = tup.parent_config if tup is not None else None
        start = str(parent["configurable"]["checkpoint_id"]) if parent else None
    elif await runtime.checkpointer.aget_tuple(checkpoint_config(record.thread_id)) is not None:
        raise ReplayError(f"run {record.run_id} wrote no checkpoint on a thread that has some: the state it "
                          "started from is unknown")
    last = str(max(roots, key=lambda c: str(c.ident)).ident) if roots else None
    now = await workspace_files(Workspace.for_thread(runtime.config.data_path, record.thread_id).real_root)
    later, own = await _changes(runtime, record)
    after = _undo(now, later)
    return RunBounds(record, start, last, files_before=_undo(after, [own]), files_after=after)


async def seed_thread(runtime: Any, bounds: RunBounds, thread_id: str) -> None:
    """Give the new thread ``thread_id`` the run's start: its checkpoint (and those before it) and
    its files; the paths whose content could not be rebuilt go to ``bounds.not_reproducible``."""
    source = bounds.record.thread_id
    if bounds.start is not None:
        await copy_checkpoints(runtime.checkpointer, source, thread_id, until=bounds.start)
    src = Workspace.for_thread(runtime.config.data_path, source).real_root
    dst = Workspace.for_thread(runtime.config.data_path, thread_id).real_root
    now = await workspace_files(src)
    keep = {p for p, sha in bounds.files_before.items() if now.get(p) == sha}
    bounds.not_reproducible = sorted(set(bounds.files_before) - keep)
    await asyncio.to_thread(_copy_files, src, dst, sorted(keep))


async def workspace_files(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> sha256 of its content (off the event loop)."""
    return await asyncio.to_thread(_hash_files, root)


def _hash_files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _copy_files(src: Path, dst: Path, paths: list[str]) -> None:
    for rel in paths:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)


async def _changes(runtime: Any, record: RunRecord) -> tuple[list[list[JournalEvent]], list[JournalEvent]]:
    """The ``file.changed`` records of the thread's runs after ``record`` (newest first), and its own."""
    runs = await runtime.store.list_runs(record.thread_id, limit=THREAD_RUNS_MAX)  # newest first
    later: list[list[JournalEvent]] = []
    for run in runs:
        events = await runtime.journal.list(run.run_id, kinds=["file.changed"])
        if run.run_id == record.run_id:
            return later, events
        later.append(events)
    return later, await runtime.journal.list(record.run_id, kinds=["file.changed"])


def _undo(files: dict[str, str], runs: list[list[JournalEvent]]) -> dict[str, str]:
    """``files`` as they were before ``runs`` (newest first) changed them."""
    out = dict(files)
    for events in runs:
        for event in events:
            rel = to_relpath(str(event.data.get("path") or ""))
            if rel is None:
                continue
            before = event.data.get("before_sha256")
            if before is None:
                out.pop(rel, None)
            else:
                out[rel] = str(before)
    return out


__all__ = ["ReplayError", "RunBounds", "run_bounds", "seed_thread", "workspace_files"]
