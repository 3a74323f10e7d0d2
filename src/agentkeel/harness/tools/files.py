"""Reading and editing workspace files: ``read_file``, ``write_file``, ``str_replace``.

Files are handled as bytes decoded as UTF-8 without newline translation, so an edit never rewrites
line endings the model did not touch, and the hash ``read_file`` reports is the hash of the bytes on
disk: a later guard compares it with the file's current hash to detect edits based on a stale read.

``read_file`` also reads the skills mount (``/skills/...``); ``write_file`` and ``str_replace``
refuse it. A whole read of a skill's SKILL.md says so in its artifact (``skill``), which is how
:func:`agentkeel.harness.skills.skill_read` recognises it later.

Every call is bounded in bytes (``limits.file_read_max_bytes`` of content returned,
``limits.file_write_max_bytes`` of file produced), and every file is opened below the resolved
root without following symlinks and refused when it is not a regular file with a single hard link
(:func:`~agentkeel.harness.tools.bounds.open_regular`), so nothing swapped in after the path check
can redirect a read or a write outside the workspace.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from langchain_core.tools import ToolException

from agentkeel.harness.skills import skill_artifact
from agentkeel.harness.tools._support import (
    Runtime,
    filesystem,
    is_binary,
    make_tool,
    report_touch,
    run_context,
    tool_errors,
    writable,
)
from agentkeel.harness.tools.bounds import (
    Deadline,
    file_sha256,
    iter_line_pieces,
    off_loop,
    open_regular,
    read_chunks,
    read_whole,
)


async def read_file(
    path: str,
    runtime: Runtime,
    start_line: int | None = None,
    end_line: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """Read a text file in the workspace (or a skill under /skills), optionally only a range of lines.

    Args:
        path: File path, either /workspace/... or relative to /workspace, or /skills/....
        start_line: First line to return (1-based, inclusive). Defaults to the first line.
        end_line: Last line to return (1-based, inclusive). Defaults to the last line.
    """
    first = 1 if start_line is None else start_line
    if first < 1:
        raise ToolException(f"start_line must be 1 or more, got {first}")
    if end_line is not None and end_line < first:
        raise ToolException(f"end_line ({end_line}) is before start_line ({first})")
    ctx = run_context(runtime)
    ranged = start_line is not None or end_line is not None

    def work(deadline: Deadline) -> tuple[str, dict[str, Any]]:
        with tool_errors(path):
            ws = filesystem(ctx, path)
            real = ws.resolve(path)
            with open_regular(real, beneath=ws.real_root) as handle:
                text, digest = _read_selection(
                    path, handle, first, end_line, ranged, deadline, ctx.file_read_max_bytes
                )
        virtual = ws.to_virtual(real)
        artifact: dict[str, Any] = {"sha256": digest, "path": virtual}
        skill = None if ws.writable else skill_artifact(virtual, text, digest)
        if skill is not None:
            artifact["skill"] = skill
        return text, artifact

    return await off_loop("read_file", ctx.workspace_tool_timeout_s, work)


def _read_selection(
    path: str, handle: BinaryIO, first: int, last: int | None, ranged: bool, deadline: Deadline, cap: int
) -> tuple[str, str]:
    """Lines ``first..last`` of the file (at most ``cap`` bytes of them, as UTF-8) and the whole
    file's hash.

    The file is streamed: text is decoded only up to the end of the selection (or the cut), the
    rest is only hashed, so memory stays bounded (the cap plus one chunk) however large the file is.
    """
    digest = hashlib.sha256()

    def chunks() -> Iterator[bytes]:
        for index, chunk in enumerate(read_chunks(handle, deadline)):
            if index == 0 and is_binary(chunk):
                raise ToolException(f"{path}: binary file, not shown")
            digest.update(chunk)
            yield chunk

    source = chunks()
    kept: list[str] = []
    room = cap
    cut = False
    number = 1  # the line the next piece belongs to
    open_line = False  # the last piece did not end its line
    for piece, ends_line in iter_line_pieces(source):
        if number >= first:
            encoded = piece.encode("utf-8")
            cut = len(encoded) > room
            if cut:  # whole characters only
                piece = encoded[:room].decode("utf-8", errors="ignore")
            kept.append(piece)
            room -= min(len(encoded), room)
        open_line = not ends_line
        number += ends_line
        if cut or (last is not None and number > last):
            break
    for _ in source:  # the rest of the file only feeds the hash
        pass
    lines = number - 1 + open_line
    if ranged and first > lines and not kept:
        raise ToolException(f"{path} has {lines} lines; start_line {first} is past the end")
    text = "".join(kept)
    if cut:
        text += (
            f"\n[... cut at {cap} bytes (limits.file_read_max_bytes); read further with start_line/end_line]"
        )
    return text, digest.hexdigest()


async def write_file(path: str, content: str, runtime: Runtime, append: bool = False) -> str:
    """Create or overwrite a file in the workspace (parent directories are created as needed).

    Put deliverables under /workspace/outputs.

    Args:
        path: File path, either /workspace/... or relative to /workspace.
        content: The text to write.
        append: Append to the end of the file instead of replacing its content.
    """
    data = content.encode("utf-8")
    _check_write_size(path, len(data), run_context(runtime).file_write_max_bytes)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    virtual = await _change(runtime, "write_file", path, flags, lambda real, deadline: data)
    return f"{'Appended' if append else 'Wrote'} {len(data)} bytes to {virtual}"


async def str_replace(path: str, old: str, new: str, runtime: Runtime, replace_all: bool = False) -> str:
    """Replace an exact piece of text in a workspace file.

    `old` must occur exactly once unless replace_all is true; include enough surrounding text to
    make it unique.

    Args:
        path: File path, either /workspace/... or relative to /workspace.
        old: The exact text to replace (whitespace and indentation included).
        new: The replacement text.
        replace_all: Replace every occurrence instead of requiring exactly one.
    """
    if not old:
        raise ToolException("old must not be empty")
    replaced: list[int] = []
    cap = run_context(runtime).file_write_max_bytes

    def edit(real: Path, deadline: Deadline) -> bytes:
        data = read_whole(real, deadline, cap)
        if data is None:
            raise ToolException(
                f"{path}: too large for str_replace (over the {cap}-byte limits.file_write_max_bytes); "
                "edit it with bash (sed) or rewrite it with write_file"
            )
        text = data.decode("utf-8")
        count = text.count(old)
        if count == 0:
            raise ToolException(f"{path}: old text not found; nothing was replaced")
        if count > 1 and not replace_all:
            raise ToolException(
                f"{path}: old text occurs {count} times; add surrounding context to make it "
                "unique, or set replace_all to replace all of them"
            )
        result = text.replace(old, new).encode("utf-8")
        _check_write_size(path, len(result), cap)
        replaced.append(count)
        return result

    virtual = await _change(runtime, "str_replace", path, os.O_WRONLY | os.O_TRUNC, edit)
    count = replaced[0]
    return f"Replaced {count} occurrence{'s' if count > 1 else ''} in {virtual}"


async def _change(
    runtime: Runtime, tool: str, path: str, flags: int, produce: Callable[[Path, Deadline], bytes]
) -> str:
    """Write ``produce(real_path, deadline)`` to ``path`` opened with ``flags``, off the loop;
    the virtual path written.

    The change ledger hears of the file once it was opened for writing, also when the call then
    fails or runs out of time part-way: the file may have changed, and the ledger must not miss it.
    It also hears the file's sha256 after a complete write (the whole file: an append re-reads it),
    so a file several calls changed shows each step's result. An append that would make the file
    larger than ``limits.file_write_max_bytes`` is refused before anything is written.
    """
    ctx = run_context(runtime)
    opened: list[str] = []
    after: list[str] = []

    def work(deadline: Deadline) -> str:
        with tool_errors(path):
            ws = writable(ctx, path)
            real = ws.resolve(path)
            data = produce(real, deadline)
            with open_regular(real, flags, beneath=ws.real_root, make_parents=True) as handle:
                if flags & os.O_APPEND:
                    _check_write_size(path, os.fstat(handle.fileno()).st_size + len(data), ctx.file_write_max_bytes)
                opened.append(ws.to_virtual(real))
                handle.write(data)
            after.append(file_sha256(real, deadline) if flags & os.O_APPEND else hashlib.sha256(data).hexdigest())
        return opened[0]

    try:
        return await off_loop(tool, ctx.workspace_tool_timeout_s, work)
    finally:
        if opened:
            report_touch(runtime, opened[0], tool, after[0] if after else None)


def _check_write_size(path: str, size: int, cap: int) -> None:
    if size > cap:
        raise ToolException(
            f"{path}: the file would be {size} bytes, over the {cap}-byte limits.file_write_max_bytes; "
            "nothing was written"
        )


READ_FILE = make_tool(read_file, "read_file", response_format="content_and_artifact")
WRITE_FILE = make_tool(write_file, "write_file")
STR_REPLACE = make_tool(str_replace, "str_replace")
