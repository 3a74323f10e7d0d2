"""The per-thread workspace and the confinement of every path a tool touches.

Tools never see host paths: the model addresses files as ``/workspace/...`` (or relative to it)
and :meth:`Workspace.resolve` is the single gate that turns such a path into a host path. The gate
resolves symlinks itself and returns the fully resolved path, so what was checked is exactly what
the caller opens: a symlink planted in the workspace (by a bash command, an upload, an extracted
archive) can never lead a tool outside.

A :class:`ReadOnlyMount` is another host directory shown to tools under its own virtual root (the
skills directory as ``/skills``). It is the same gate with another root, not a second one, and it
is never created: what lies there belongs to the deployment, not to the thread.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

VIRTUAL_ROOT = "/workspace"
"""How tools and the model name the workspace root."""

OUTPUTS_DIR = "outputs"
UPLOADS_DIR = "uploads"

_THREAD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def to_relpath(path: str) -> str | None:
    """``/workspace/x/y`` (or relative ``x/y``) -> ``x/y``, normalised without touching the disk;
    None for anything outside the workspace (or the root itself)."""
    norm = posixpath.normpath(path)
    if norm.startswith(VIRTUAL_ROOT + "/"):
        return norm[len(VIRTUAL_ROOT) + 1 :]
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or norm in (".", VIRTUAL_ROOT):
        return None
    return norm


def to_virtual(relpath: str) -> str:
    return f"{VIRTUAL_ROOT}/{relpath}"


class PathOutsideWorkspace(PermissionError):
    """A path that would leave the workspace: ``..``, a host path, or a symlink pointing out."""

    def __init__(self, virtual_path: str, reason: str, root: str = VIRTUAL_ROOT) -> None:
        super().__init__(f"access refused: {virtual_path!r} {reason} (only {root} is allowed)")
        self.virtual_path = virtual_path


class Workspace:
    """One thread's workspace directory, seen by tools as :data:`VIRTUAL_ROOT`."""

    writable = True

    def __init__(self, root: Path, virtual_root: str = VIRTUAL_ROOT) -> None:
        self.root = Path(root)
        self.virtual_root = virtual_root
        self._real_root: Path | None = None

    @classmethod
    def for_thread(cls, data_dir: Path, thread_id: str) -> Workspace:
        """The workspace of ``thread_id`` under ``data_dir``.

        The thread id becomes a directory name, so anything but a plain single path component
        (no separators, no ``.``/``..``, no hidden names) is rejected rather than sanitised: two
        ids must never map to the same directory.
        """
        if not _THREAD_ID.fullmatch(thread_id):
            raise ValueError(f"thread id {thread_id!r} is not a safe directory name")
        return cls(Path(data_dir) / "threads" / thread_id / "workspace")

    @property
    def real_root(self) -> Path:
        """The root with symlinks resolved, created (with outputs/ and uploads/) on first use."""
        if self._real_root is None:
            self._prepare()
            self._real_root = self.root.resolve(strict=True)
        return self._real_root

    def _prepare(self) -> None:
        for sub in (OUTPUTS_DIR, UPLOADS_DIR):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def resolve(self, virtual_path: str) -> Path:
        """The real host path for ``virtual_path``, or :class:`PathOutsideWorkspace`.

        Accepts ``/workspace/...`` (the virtual root), paths relative to it, and host paths that already
        lie inside the workspace (what ``pwd`` shows in a bash command). ``..`` is applied
        lexically and may not climb above the root; the remaining path is then resolved through
        every symlink (including a dangling final one) and must still lie inside the real root.
        The returned path contains no symlinks, so opening it follows nothing unchecked.
        """
        if "\0" in virtual_path:
            raise ValueError(f"path {virtual_path!r} contains a NUL byte")
        relative = self._relative_part(virtual_path)
        parts: list[str] = []
        for part in relative.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise PathOutsideWorkspace(virtual_path, f"climbs above {self.virtual_root}", self.virtual_root)
                parts.pop()
            else:
                parts.append(part)
        root = self.real_root
        real = Path(os.path.realpath(root.joinpath(*parts)))
        if not real.is_relative_to(root):
            raise PathOutsideWorkspace(
                virtual_path, f"leads outside {self.virtual_root} through a symlink", self.virtual_root
            )
        return real

    def to_virtual(self, real_path: Path) -> str:
        """The ``/workspace/...`` (virtual root) name of a host path inside the workspace."""
        absolute = Path(os.path.abspath(real_path))
        for base in (self.real_root, Path(os.path.abspath(self.root))):
            if absolute.is_relative_to(base):
                relative = absolute.relative_to(base).as_posix()
                return self.virtual_root if relative == "." else f"{self.virtual_root}/{relative}"
        raise PathOutsideWorkspace(str(real_path), f"is not inside {self.virtual_root}", self.virtual_root)

    def iter_files(self) -> Iterator[str]:
        """Relative posix paths of the regular files, depth first, sorted within each directory.

        Symlinks are neither followed nor reported, so a snapshot only ever contains bytes that
        really live in this workspace.
        """
        for entry, relative in self.walk():
            if entry.is_file(follow_symlinks=False):
                yield relative

    def walk(self, start: Path | None = None) -> Iterator[tuple[os.DirEntry[str], str]]:
        """Every entry below ``start`` (default: the root) with its path relative to the root.

        Directories are yielded before their contents; symlinked directories are yielded but never
        entered, which keeps a walk inside the workspace and immune to symlink loops.
        """
        root = self.real_root
        stack = [start if start is not None else root]
        while stack:
            directory = stack.pop()
            try:
                with os.scandir(directory) as scan:
                    entries = sorted(scan, key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            subdirs: list[Path] = []
            for entry in entries:
                yield entry, PurePosixPath(Path(entry.path).relative_to(root)).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(Path(entry.path))
            stack.extend(reversed(subdirs))

    def listing(self, max_entries: int) -> dict[str, tuple[int, int]] | None:
        """``relative path -> (size, mtime_ns)`` of every non-directory entry, or None if too many.

        A cheap before/after fingerprint for commands whose writes are not otherwise observable;
        the bound keeps it cheap on huge trees (callers then fall back to a coarser report).
        """
        result: dict[str, tuple[int, int]] = {}
        for entry, relative in self.walk():
            if entry.is_dir(follow_symlinks=False):
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            result[relative] = (stat.st_size, stat.st_mtime_ns)
            if len(result) > max_entries:
                return None
        return result

    def _relative_part(self, virtual_path: str) -> str:
        """The part of ``virtual_path`` below the workspace root, before any normalisation."""
        path = virtual_path
        if not path.startswith("/"):
            return path
        if self.contains(path):
            return path[len(self.virtual_root) :]
        host = Path(os.path.normpath(path))
        for base in (self.real_root, Path(os.path.abspath(self.root))):
            if host.is_relative_to(base):
                return host.relative_to(base).as_posix()
        raise PathOutsideWorkspace(
            virtual_path, f"is an absolute path outside {self.virtual_root}", self.virtual_root
        )

    def contains(self, virtual_path: str) -> bool:
        """Whether ``virtual_path`` names the virtual root or a path below it (lexically: a ``..``
        in it is checked by :meth:`resolve`, not here)."""
        return virtual_path == self.virtual_root or virtual_path.startswith(self.virtual_root + "/")


class ReadOnlyMount(Workspace):
    """A host directory shown to tools under ``virtual_root``, confined exactly like the workspace.

    Never created (a missing directory is "no such file"), and ``writable`` is False: the file
    tools refuse to change anything under it, so whatever the deployment put there (skills) is
    what every run reads.
    """

    writable = False

    def _prepare(self) -> None:
        """Nothing to create: the directory is the deployment's."""
