"""Workspace snapshots: what a run changed, which step changed it, and how to put it back.

The worker captures the thread's workspace before the run and after it; the diff becomes the run's
``file.changed`` journal records (and the ``/changes`` route), each attributed by ``ChangeTracker``
to every tool call that reported touching the path, in order (``steps``; the top-level
``tool_call_id`` / ``tool_name`` / ``tool_seq`` name the last one). A rollback restores the
"before" snapshot.

Why content is bounded: hashes are always computed (so every change is *seen*), but file contents are
kept only up to per-file and total byte limits, and, given a ``reserve`` (the worker passes its
process's ``ContentBudget``), only while the process-wide budget has room: concurrent runs cannot
hold one full snapshot each. The kept bytes stay charged until the owner releases
``content_bytes``. A change to a file whose content was not kept cannot
be undone, and ``restore_snapshot`` says so (``unrestorable``) instead of pretending — the caller
refuses or flags the rollback. ``dry_run`` lets it decide before touching anything.

Symlinks are never followed: they are recorded as links (their target string is their content) and
restored as links. Every write and delete checks that the path's parent still resolves inside the
root, so a link planted during the run cannot redirect a restore outside the workspace.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentkeel.sandbox.workspace import to_relpath, to_virtual

log = logging.getLogger(__name__)

Change = Literal["added", "modified", "deleted"]
Reserve = Callable[[int], bool]
Release = Callable[[int], None]
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileState:
    sha256: str
    size: int
    content: bytes | None  # None: over the capture limits, not restorable
    mode: int = 0o644
    symlink: bool = False  # content/sha256 are then those of the link target string


class WorkspaceSnapshot(Mapping[str, FileState]):
    """Relative POSIX path -> FileState for every regular file and symlink, plus the directories."""

    def __init__(
        self, files: dict[str, FileState], dirs: frozenset[str] = frozenset(), content_bytes: int = 0
    ) -> None:
        self._files = files
        self.dirs = dirs
        self.content_bytes = content_bytes
        """Bytes of content kept (what the capture's ``reserve`` was charged for)."""

    def __getitem__(self, path: str) -> FileState:
        return self._files[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    @property
    def uncaptured(self) -> list[str]:
        """Paths whose content was over the limits (changes to them cannot be undone)."""
        return sorted(p for p, s in self._files.items() if s.content is None)


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to the workspace root
    change: Change
    before_sha256: str | None
    after_sha256: str | None


@dataclass(frozen=True)
class RestoreReport:
    restored: list[str] = field(default_factory=list)  # rewritten from the before snapshot
    deleted: list[str] = field(default_factory=list)  # added since, removed
    unrestorable: list[str] = field(default_factory=list)  # content not captured, or unsafe path

    @property
    def complete(self) -> bool:
        return not self.unrestorable


# -- capture ---------------------------------------------------------------------------------
def capture_snapshot(
    root: Path, max_file_bytes: int, max_total_bytes: int, reserve: Reserve | None = None,
    release: Release | None = None,
) -> WorkspaceSnapshot:
    """Hash every file under ``root``; keep contents within the limits (in sorted path order).

    ``reserve(n)`` is asked before ``n`` bytes of content are kept (``False``: hash only) and
    ``release`` gets back what a file turned out not to need (it shrank or grew since its
    ``stat``); the snapshot's ``content_bytes`` is what stays reserved. A missing root is an empty
    workspace. Files that vanish or cannot be read mid-walk are skipped.
    """
    files: dict[str, FileState] = {}
    dirs: set[str] = set()
    budget = max_total_bytes
    held = 0  # content bytes kept (link targets too: they are never counted against ``budget``)
    for rel, entry in _walk(root, "", dirs):
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.fsencode(os.readlink(entry.path))
                kept = reserve is None or reserve(len(target))
                held += len(target) if kept else 0
                files[rel] = FileState(_sha(target), len(target), target if kept else None, symlink=True)
                continue
            keep = st.st_size <= min(max_file_bytes, budget) and (reserve is None or reserve(st.st_size))
            reserved = st.st_size if keep else 0
            try:
                digest, size, content = _hash_file(entry.path, reserved if keep else None)
            except OSError:
                if reserved and release is not None:
                    release(reserved)
                raise
        except OSError as exc:
            log.warning("snapshot: skipping %s: %s", rel, exc)
            continue
        kept_bytes = size if content is not None else 0
        if release is not None and reserved > kept_bytes:
            release(reserved - kept_bytes)
        budget -= kept_bytes
        held += kept_bytes
        files[rel] = FileState(digest, size, content, stat.S_IMODE(st.st_mode))
    return WorkspaceSnapshot(files, frozenset(dirs), held)


async def acapture_snapshot(
    root: Path, max_file_bytes: int, max_total_bytes: int, reserve: Reserve | None = None,
    release: Release | None = None,
) -> WorkspaceSnapshot:
    """``capture_snapshot`` off the event loop (the walk and the hashing block).

    A workspace that does not exist yet or is empty (every new thread's) is walked here, on the
    loop: one ``scandir``, where the hop to a worker thread and back behind every other ready task cost a
    new run's start several milliseconds under load. Cancelled, it still gives back what the walk
    reserved: a thread cannot be stopped, so the walk finishes on its own and its snapshot's
    ``content_bytes`` are released then, not leaked."""
    if _empty(root):
        return capture_snapshot(root, max_file_bytes, max_total_bytes, reserve, release)
    capture = asyncio.ensure_future(
        asyncio.to_thread(capture_snapshot, root, max_file_bytes, max_total_bytes, reserve, release)
    )
    try:
        return await asyncio.shield(capture)
    except asyncio.CancelledError:
        if release is not None:
            capture.add_done_callback(lambda done: _release_abandoned(done, release))
        raise


def _empty(root: Path) -> bool:
    """Whether ``root`` is missing or has no entries (a non-directory is left to the walk)."""
    try:
        with os.scandir(root) as it:
            return next(it, None) is None
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _release_abandoned(done: asyncio.Future[WorkspaceSnapshot], release: Release) -> None:
    if not done.cancelled() and done.exception() is None:
        release(done.result().content_bytes)


def _walk(root: Path, rel: str, dirs: set[str]) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Files and links below ``root/rel``, collecting directories into ``dirs``.

    Not ``Workspace.walk``: that one creates the workspace on first use, and a snapshot must only read.
    """
    try:
        with os.scandir(root / rel if rel else root) as it:
            entries = sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        if entry.is_dir(follow_symlinks=False):
            dirs.add(path)
            yield from _walk(root, path, dirs)
        elif entry.is_symlink() or entry.is_file(follow_symlinks=False):
            yield path, entry  # sockets, fifos and devices are not workspace content


def _hash_file(path: str, keep_limit: int | None) -> tuple[str, int, bytes | None]:
    """sha256 and size; the content too if it turns out to be at most ``keep_limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(keep_limit + 1) if keep_limit is not None else b""
        if keep_limit is not None and len(head) <= keep_limit:
            return _sha(head), len(head), head
        digest, size = hashlib.sha256(head), len(head)
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size, None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- diff ------------------------------------------------------------------------------------
def diff_snapshots(before: Mapping[str, FileState], after: Mapping[str, FileState]) -> list[FileDiff]:
    """Added, modified and deleted paths, sorted by path."""
    out: list[FileDiff] = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old is None:
            assert new is not None
            out.append(FileDiff(path, "added", None, new.sha256))
        elif new is None:
            out.append(FileDiff(path, "deleted", old.sha256, None))
        elif (old.sha256, old.symlink) != (new.sha256, new.symlink):
            out.append(FileDiff(path, "modified", old.sha256, new.sha256))
    return out


# -- restore ---------------------------------------------------------------------------------
def restore_snapshot(
    root: Path,
    before: WorkspaceSnapshot,
    after: WorkspaceSnapshot | None = None,
    *,
    dry_run: bool = False,
) -> RestoreReport:
    """Make ``root`` match ``before`` as far as captured content allows.

    ``after`` is the current state (captured now, hashes only, when omitted). Files added since are
    deleted, changed and deleted files are rewritten, directories created since are removed when
    empty and directories deleted since are recreated. Paths whose content ``before`` did not keep
    are left as they are and listed in ``unrestorable``.
    """
    if after is None:
        after = capture_snapshot(root, 0, 0)
    diffs = diff_snapshots(before, after)
    deleted = [d.path for d in diffs if d.change == "added"]
    rewrite = [d.path for d in diffs if d.change != "added"]
    restored = [p for p in rewrite if before[p].content is not None]
    unrestorable = [p for p in rewrite if before[p].content is None]
    if dry_run:
        return RestoreReport(restored, deleted, unrestorable)
    real_root = root.resolve()
    deleted = [p for p in deleted if _apply(real_root, p, _remove, unrestorable)]
    for directory in sorted(after.dirs - before.dirs, reverse=True):  # children before parents
        _rmdir_if_empty(real_root, directory)
    for directory in sorted(before.dirs - after.dirs):
        _apply(real_root, directory, lambda target: target.mkdir(parents=True, exist_ok=True), unrestorable)
    restored = [p for p in restored if _apply(real_root, p, _writer(before[p]), unrestorable)]
    return RestoreReport(restored, deleted, sorted(unrestorable))


async def arestore_snapshot(
    root: Path, before: WorkspaceSnapshot, after: WorkspaceSnapshot | None = None, *, dry_run: bool = False
) -> RestoreReport:
    """``restore_snapshot`` off the event loop."""
    return await asyncio.to_thread(restore_snapshot, root, before, after, dry_run=dry_run)


def _apply(root: Path, rel: str, action: Callable[[Path], None], failures: list[str]) -> bool:
    """Run ``action`` on ``root/rel`` if its parent resolves inside ``root``; record failures."""
    target = root / rel
    try:
        if not target.parent.resolve().is_relative_to(root):
            raise PermissionError(f"{rel}: parent resolves outside the workspace")
        action(target)
        return True
    except OSError as exc:
        log.warning("restore: %s: %s", rel, exc)
        failures.append(rel)
        return False


def _remove(target: Path) -> None:
    target.unlink(missing_ok=True)


def _rmdir_if_empty(root: Path, rel: str) -> None:
    target = root / rel
    if target.is_dir() and not target.is_symlink() and target.resolve().is_relative_to(root):
        try:
            target.rmdir()
        except OSError:  # not empty: holds something the restore could not remove
            pass


def _writer(state: FileState) -> Callable[[Path], None]:
    """Write ``state`` atomically: a temp file (or link) beside the target, then rename over it.

    Renaming replaces whatever is at the target — a symlink included — without following it.
    """
    assert state.content is not None
    content = state.content

    def write(target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if state.symlink:
            tmp = target.parent / f".keel-restore-{os.getpid()}-{threading.get_ident()}"
            tmp.unlink(missing_ok=True)
            os.symlink(os.fsdecode(content), tmp)
        else:
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=".keel-restore-")
            tmp = Path(name)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(content)
                os.chmod(tmp, state.mode)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        if target.is_dir() and not target.is_symlink():
            target.rmdir()  # an emptied directory created where the file was
        os.replace(tmp, target)

    return write


# -- attribution -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Touch:
    tool_call_id: str | None
    tool_name: str
    after_sha256: str | None
    agent: str = "lead"  # or subagent:<type>/<task_id>


class ChangeTracker:
    """The run's ``FileTouchRecorder``: remembers every tool call that touched each path, in order.

    A file created by ``write_file`` and then edited by ``str_replace`` was changed by both; naming
    only the last one hid the step that created it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # sync tools run on worker threads
        self._touches: dict[str, list[_Touch]] = {}

    def touched(
        self, virtual_path: str, tool_call_id: str | None, tool_name: str, after_sha256: str | None = None,
        agent: str | None = None,
    ) -> None:
        rel = to_relpath(virtual_path)
        if rel is None:
            log.debug("change tracker: ignoring path outside the workspace: %s", virtual_path)
            return
        touch = _Touch(tool_call_id, tool_name, after_sha256, agent or "lead")
        with self._lock:
            steps = self._touches.setdefault(rel, [])
            if steps and (steps[-1].tool_call_id, steps[-1].tool_name) == (tool_call_id, tool_name):
                steps[-1] = touch  # the same step reporting again: its latest hash stands
            else:
                steps.append(touch)

    def attribute(
        self, diffs: list[FileDiff], seq_of_tool_call: Callable[[str], int | None]
    ) -> list[dict[str, Any]]:
        """``file.changed`` record data for each diff; ``tool_call_id`` None = changed outside any
        tool that reported it (e.g. by a shell command or another process).

        ``steps`` lists every reporting tool call in order, each with its journal seq and the
        file's hash before and after it (``None`` where a step could not hash the file); the
        first step starts from the run's "before" hash."""
        with self._lock:
            touches = {path: list(steps) for path, steps in self._touches.items()}
        records: list[dict[str, Any]] = []
        for diff in diffs:
            steps: list[dict[str, Any]] = []
            before = diff.before_sha256
            for touch in touches.get(diff.path, []):
                call_id = touch.tool_call_id
                steps.append({
                    "tool_call_id": call_id,
                    "tool_name": touch.tool_name,
                    "agent": touch.agent,
                    "tool_seq": seq_of_tool_call(call_id) if call_id else None,
                    "before_sha256": before,
                    "after_sha256": touch.after_sha256,
                })
                before = touch.after_sha256
            last = steps[-1] if steps else {"tool_call_id": None, "tool_name": None, "tool_seq": None, "agent": None}
            records.append(
                {
                    "path": to_virtual(diff.path),
                    "change": diff.change,
                    "before_sha256": diff.before_sha256,
                    "after_sha256": diff.after_sha256,
                    "tool_call_id": last["tool_call_id"],
                    "tool_name": last["tool_name"],
                    "tool_seq": last["tool_seq"],
                    "agent": last["agent"],
                    "steps": steps,
                }
            )
        return records
