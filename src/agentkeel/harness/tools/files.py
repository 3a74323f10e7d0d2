"""Reading and editing workspace files: ``read_file``, ``write_file``, ``str_replace``.

Files are handled as bytes decoded as UTF-8 without newline translation, so an edit never rewrites
line endings the model did not touch, and the hash ``read_file`` reports is the hash of the bytes on
disk: a later guard compares it with the file's current hash to detect edits based on a stale read.
"""

from __future__ import annotations

import hashlib
from typing import Any

from langchain_core.tools import ToolException

from agentkeel.harness.tools._support import (
    Runtime,
    is_binary,
    make_tool,
    report_touch,
    tool_errors,
    workspace,
)

READ_CAP_CHARS = 100_000
"""The most text one ``read_file`` call returns; longer selections are cut with a note."""


def read_file(
    path: str,
    runtime: Runtime,
    start_line: int | None = None,
    end_line: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """Read a text file in the workspace, optionally only a range of lines.

    Args:
        path: File path, either /workspace/... or relative to /workspace.
        start_line: First line to return (1-based, inclusive). Defaults to the first line.
        end_line: Last line to return (1-based, inclusive). Defaults to the last line.
    """
    ws = workspace(runtime)
    with tool_errors(path):
        real = ws.resolve(path)
        data = real.read_bytes()
        if is_binary(data):
            raise ToolException(f"{path}: binary file, not shown")
        text = data.decode("utf-8", errors="replace")
    selected = _select_lines(path, text, start_line, end_line)
    if len(selected) > READ_CAP_CHARS:
        selected = (
            selected[:READ_CAP_CHARS]
            + f"\n[... cut at {READ_CAP_CHARS} characters; read further with start_line/end_line]"
        )
    artifact = {"sha256": hashlib.sha256(data).hexdigest(), "path": ws.to_virtual(real)}
    return selected, artifact


def _select_lines(path: str, text: str, start_line: int | None, end_line: int | None) -> str:
    if start_line is None and end_line is None:
        return text
    lines = text.splitlines(keepends=True)
    first = 1 if start_line is None else start_line
    last = len(lines) if end_line is None else end_line
    if first < 1:
        raise ToolException(f"start_line must be 1 or more, got {first}")
    if first > len(lines):
        raise ToolException(f"{path} has {len(lines)} lines; start_line {first} is past the end")
    if last < first:
        raise ToolException(f"end_line ({last}) is before start_line ({first})")
    return "".join(lines[first - 1 : last])


def write_file(path: str, content: str, runtime: Runtime, append: bool = False) -> str:
    """Create or overwrite a file in the workspace (parent directories are created as needed).

    Put deliverables under /workspace/outputs.

    Args:
        path: File path, either /workspace/... or relative to /workspace.
        content: The text to write.
        append: Append to the end of the file instead of replacing its content.
    """
    ws = workspace(runtime)
    data = content.encode("utf-8")
    with tool_errors(path):
        real = ws.resolve(path)
        real.parent.mkdir(parents=True, exist_ok=True)
        with real.open("ab" if append else "wb") as handle:
            handle.write(data)
    virtual = ws.to_virtual(real)
    report_touch(runtime, virtual, "write_file")
    return f"{'Appended' if append else 'Wrote'} {len(data)} bytes to {virtual}"


def str_replace(path: str, old: str, new: str, runtime: Runtime, replace_all: bool = False) -> str:
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
    ws = workspace(runtime)
    with tool_errors(path):
        real = ws.resolve(path)
        text = real.read_bytes().decode("utf-8")
        count = text.count(old)
        if count == 0:
            raise ToolException(f"{path}: old text not found; nothing was replaced")
        if count > 1 and not replace_all:
            raise ToolException(
                f"{path}: old text occurs {count} times; add surrounding context to make it "
                "unique, or set replace_all to replace all of them"
            )
        real.write_bytes(text.replace(old, new).encode("utf-8"))
    virtual = ws.to_virtual(real)
    report_touch(runtime, virtual, "str_replace")
    return f"Replaced {count} occurrence{'s' if count > 1 else ''} in {virtual}"


READ_FILE = make_tool(read_file, "read_file", response_format="content_and_artifact")
WRITE_FILE = make_tool(write_file, "write_file")
STR_REPLACE = make_tool(str_replace, "str_replace")
