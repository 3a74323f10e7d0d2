"""How workspace tools stay bounded: off the event loop, within a time limit, in bounded memory.

Why: one tool call shares its process with every other run's event loop, heartbeats and lease
renewals. A call that runs on the loop, or that holds the GIL in one long C call (Python's ``re``
does, even in a worker thread), stops all of them; a call that never ends keeps shutdown waiting.

So every file-system tool runs its work in :func:`off_loop`: a dedicated daemon thread, a
:class:`Deadline` the work checks between steps (between lines, files, directory entries, chunks),
and a hard wait bound on the loop side for work stuck in a system call. Daemon threads, not the
default executor: a thread stuck in the kernel neither takes a shared pool slot nor holds up the
process's exit. Files are opened with :func:`open_regular` (a FIFO or device in the workspace
would block ``open`` or ``read`` forever) and read in chunks (:func:`iter_line_pieces`,
:func:`file_sha256`) so a huge file never sits in memory whole.
"""

from __future__ import annotations

import asyncio
import codecs
import contextvars
import errno
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from langchain_core.tools import ToolException

T = TypeVar("T")

CHUNK_BYTES = 1 << 20
"""How much of a file is read at a time."""

WHOLE_FILE_MAX_BYTES = 10_000_000
"""The largest file a tool loads whole: grep skips larger files, str_replace refuses them."""

STUCK_GRACE_S = 2.0
"""How long past its deadline a call may take to notice it, before the loop stops waiting for it
(work stuck in a system call); the thread is then abandoned and ends whenever the kernel lets it."""


class TimeLimitExceeded(ToolException):
    """A workspace tool ran past the run's ``limits.workspace_tool_timeout_s``."""


class Deadline:
    """When the work must stop: at a point in time, or earlier when the caller gave up on it."""

    def __init__(self, tool: str, limit_s: float) -> None:
        self.tool = tool
        self.limit_s = limit_s
        self._at = time.monotonic() + limit_s
        self._abandoned = threading.Event()

    @property
    def expired(self) -> bool:
        return self._abandoned.is_set() or time.monotonic() >= self._at

    def check(self) -> None:
        """Raise :class:`TimeLimitExceeded` once the deadline has passed."""
        if self.expired:
            raise TimeLimitExceeded(self.message())

    def abandon(self) -> None:
        """The caller stopped waiting (cancelled, or timed out): stop at the next check."""
        self._abandoned.set()

    def message(self) -> str:
        return (
            f"{self.tool} stopped after the {self.limit_s:g} s time limit of workspace tools; "
            "narrow the path, the pattern or the line range"
        )


async def off_loop(tool: str, limit_s: float, work: Callable[[Deadline], T]) -> T:
    """``work(deadline)`` in a daemon thread; its result, or its exception, on the loop.

    Cancelling the caller (a cancelled run, a shutdown) abandons the deadline, so cooperative work
    stops at its next check instead of running on unobserved.
    """
    deadline = Deadline(tool, limit_s)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = context.run(work, deadline)
        except BaseException as exc:  # noqa: BLE001 -- delivered to the awaiting coroutine, not lost in the thread
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
            pass

    threading.Thread(target=target, name=f"agentkeel-{tool}", daemon=True).start()
    try:
        return await asyncio.wait_for(future, limit_s + STUCK_GRACE_S)
    except TimeoutError:
        raise TimeLimitExceeded(deadline.message()) from None
    finally:
        deadline.abandon()


def open_regular(
    path: Path,
    flags: int = os.O_RDONLY,
    mode: int = 0o666,
    *,
    beneath: Path | None = None,
    make_parents: bool = False,
) -> BinaryIO:
    """``path`` opened for binary I/O, if it is a regular file with a single hard link.

    ``O_NONBLOCK`` makes opening a FIFO return at once (or fail with ENXIO for writing) instead of
    waiting for a peer; ``O_NOFOLLOW`` refuses a final component that became a symlink after the
    path was resolved. With ``beneath`` (the real root the path was resolved in) every directory
    on the way is opened relative to its parent with ``O_NOFOLLOW`` too, so a directory swapped
    for a symlink between the check and the open cannot redirect it; ``make_parents`` creates
    missing directories the same way. The type and link count are then checked on the open
    descriptor, and ``O_TRUNC`` is applied only after that check: a hard link (which shares its
    inode with a file that may lie outside the workspace), a device or a FIFO is refused with
    nothing changed.
    """
    truncate = bool(flags & os.O_TRUNC)
    flags = (flags & ~os.O_TRUNC) | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        if beneath is None:
            fd = os.open(path, flags, mode)
        else:
            fd = _open_beneath(beneath, path, flags, mode, make_parents)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader (or a device) opened for writing
            raise OSError(errno.EINVAL, "not a regular file") from None
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "is a symlink (changed after it was checked); refused") from None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_nlink > 1:
            raise OSError(
                errno.EPERM,
                f"refused: the file has {info.st_nlink} hard links, and a hard link can share its "
                "content with a file outside the workspace",
            )
        if truncate:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        writing = flags & (os.O_WRONLY | os.O_RDWR)
        return os.fdopen(fd, ("ab" if flags & os.O_APPEND else "wb") if writing else "rb")
    except BaseException:
        os.close(fd)
        raise


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_beneath(root: Path, path: Path, flags: int, mode: int, make_parents: bool) -> int:
    """``os.open(path)`` walked from ``root`` one component at a time, following no symlink."""
    parts = path.relative_to(root).parts
    directory = os.open(root, _DIRECTORY_FLAGS)
    try:
        if not parts:
            return os.open(".", flags, mode, dir_fd=directory)
        for part in parts[:-1]:
            if make_parents:
                try:
                    os.mkdir(part, dir_fd=directory)
                except FileExistsError:
                    pass
            inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=directory)
            os.close(directory)
            directory = inner
        return os.open(parts[-1], flags, mode, dir_fd=directory)
    finally:
        os.close(directory)


def read_whole(path: Path, deadline: Deadline, max_bytes: int = WHOLE_FILE_MAX_BYTES) -> bytes | None:
    """The bytes of a regular file of at most ``max_bytes``, read in chunks; None when larger."""
    with open_regular(path) as handle:
        if os.fstat(handle.fileno()).st_size > max_bytes:
            return None
        parts: list[bytes] = []
        size = 0
        for chunk in read_chunks(handle, deadline):
            size += len(chunk)
            if size > max_bytes:  # grew while being read
                return None
            parts.append(chunk)
    return b"".join(parts)


def file_sha256(path: Path, deadline: Deadline | None = None) -> str:
    """sha256 of a regular file's bytes, hashed chunk by chunk (hashlib releases the GIL)."""
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        for chunk in read_chunks(handle, deadline):
            digest.update(chunk)
    return digest.hexdigest()


_BOUNDARY_CHARS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
"""What ``str.splitlines`` ends a line on (``\\r\\n`` counts as one boundary)."""


def iter_line_pieces(chunks: Iterator[bytes]) -> Iterator[tuple[str, bool]]:
    """UTF-8 text (invalid bytes replaced) as ``(piece, ends_line)`` pairs, in bounded memory.

    Joining the pieces up to each ``ends_line`` gives exactly ``text.splitlines(keepends=True)``
    of the whole decoded text, but a line longer than a chunk arrives in several pieces, so a file
    with one endless line is never held whole. Only a trailing ``\\r`` is held back between
    chunks, because a ``\\n`` starting the next chunk belongs to the same line ending.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        text = pending + decoder.decode(chunk)
        pending = ""
        if text.endswith("\r"):
            text, pending = text[:-1], "\r"
        yield from _pieces(text)
    yield from _pieces(pending + decoder.decode(b"", final=True))


def _pieces(text: str) -> Iterator[tuple[str, bool]]:
    for line in text.splitlines(keepends=True):
        yield line, line[-1] in _BOUNDARY_CHARS


def read_chunks(handle: BinaryIO, deadline: Deadline | None) -> Iterator[bytes]:
    """``handle``'s content chunk by chunk, checking the deadline (if any) before each read."""
    while True:
        if deadline is not None:
            deadline.check()
        chunk = handle.read(CHUNK_BYTES)
        if not chunk:
            return
        yield chunk


__all__ = [
    "CHUNK_BYTES",
    "WHOLE_FILE_MAX_BYTES",
    "Deadline",
    "TimeLimitExceeded",
    "file_sha256",
    "iter_line_pieces",
    "off_loop",
    "open_regular",
    "read_chunks",
    "read_whole",
]
