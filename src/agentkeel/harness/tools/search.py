"""Finding things in the workspace: ``ls``, ``glob``, ``grep``.

All three walk the workspace without entering symlinked directories, so neither a link to ``/``
nor a symlink loop can make them leave the workspace or run forever; every result list is capped
so a huge tree cannot flood the model's context.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from langchain_core.tools import ToolException

from agentkeel.harness.tools._support import (
    Runtime,
    is_binary,
    make_tool,
    tool_errors,
    workspace,
)
from agentkeel.sandbox.workspace import VIRTUAL_ROOT, PathOutsideWorkspace, Workspace

LS_CAP = 1_000
GLOB_CAP = 500
GREP_CAP = 200
GREP_LINE_CHARS = 500
GREP_MAX_FILE_BYTES = 10_000_000
"""Files larger than this are skipped by grep: almost certainly data, not something to read."""


def ls(runtime: Runtime, path: str = VIRTUAL_ROOT) -> str:
    """List a workspace directory: sub-directories end with '/', symlinks with '@', files show size.

    Args:
        path: Directory path, either /workspace/... or relative to /workspace.
    """
    ws = workspace(runtime)
    with tool_errors(path):
        real = ws.resolve(path)
        if not real.is_dir():
            raise ToolException(f"{path}: not a directory (use read_file for files)")
        entries = sorted(real.iterdir(), key=lambda p: p.name)
        lines = [_describe(entry) for entry in entries[:LS_CAP]]
    if len(entries) > LS_CAP:
        lines.append(f"[... {len(entries) - LS_CAP} more entries not shown]")
    return "\n".join(lines) if lines else f"{ws.to_virtual(real)} is empty"


def _describe(entry: Path) -> str:
    if entry.is_symlink():
        return f"{entry.name}@"
    if entry.is_dir():
        return f"{entry.name}/"
    return f"{entry.name}  ({entry.stat().st_size} bytes)"


def glob(pattern: str, runtime: Runtime) -> str:
    """Find workspace files and directories whose path matches a glob pattern.

    Patterns are relative to /workspace: '*' and '?' stay within one path segment, '**' spans any
    number of directories (e.g. '**/*.py', 'outputs/*.md'). Results are sorted.

    Args:
        pattern: Glob pattern relative to /workspace.
    """
    segments = _pattern_segments(pattern)
    ws = workspace(runtime)
    matches: list[str] = []
    for entry, relative in ws.walk():
        if not _matches(segments, relative.split("/")):
            continue
        if entry.is_symlink() and not _stays_inside(ws, relative):
            continue
        matches.append(f"{VIRTUAL_ROOT}/{relative}")
    if not matches:
        return f"No paths match {pattern!r}."
    shown = matches[:GLOB_CAP]
    if len(matches) > GLOB_CAP:
        shown.append(f"[... {len(matches) - GLOB_CAP} more matches; narrow the pattern]")
    return "\n".join(shown)


def _pattern_segments(pattern: str) -> list[str]:
    """The pattern's segments below the workspace root; patterns may not reach outside it."""
    relative = pattern
    if pattern == VIRTUAL_ROOT or pattern.startswith(VIRTUAL_ROOT + "/"):
        relative = pattern[len(VIRTUAL_ROOT) :]
    elif pattern.startswith("/"):
        raise ToolException(f"glob pattern {pattern!r} must be relative to {VIRTUAL_ROOT}")
    segments = [s for s in relative.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise ToolException(f"glob pattern {pattern!r} may not contain '..'")
    if not segments:
        raise ToolException("glob pattern is empty")
    return segments


def _matches(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Segment-wise glob match, where a '**' segment stands for zero or more path segments."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


def _stays_inside(ws: Workspace, relative: str) -> bool:
    try:
        ws.resolve(relative)
    except PathOutsideWorkspace:
        return False
    return True


def grep(pattern: str, runtime: Runtime, path: str = VIRTUAL_ROOT) -> str:
    """Search text files for lines matching a Python regular expression.

    Each match is printed as 'path:line_number:line'. Binary and very large files are skipped.

    Args:
        pattern: Python regular expression (re.search semantics, case-sensitive).
        path: File or directory to search, either /workspace/... or relative to /workspace.
    """
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolException(f"invalid regular expression {pattern!r}: {exc}") from None
    ws = workspace(runtime)
    with tool_errors(path):
        real = ws.resolve(path)
        if not real.exists():
            raise FileNotFoundError(path)
    if real.is_dir():
        files = [Path(e.path) for e, _ in ws.walk(real) if e.is_file(follow_symlinks=False)]
    else:
        files = [real]
    results: list[str] = []
    for file in files:
        _grep_file(ws, file, regex, results)
        if len(results) > GREP_CAP:
            results = results[:GREP_CAP]
            results.append(f"[... stopped after {GREP_CAP} matches; narrow the pattern or path]")
            break
    return "\n".join(results) if results else f"No matches for {pattern!r}."


def _grep_file(ws: Workspace, file: Path, regex: re.Pattern[str], results: list[str]) -> None:
    """Append ``file``'s matching lines to ``results``; unreadable files are silently skipped."""
    try:
        if file.stat().st_size > GREP_MAX_FILE_BYTES:
            return
        data = file.read_bytes()
    except OSError:
        return
    if is_binary(data):
        return
    virtual = ws.to_virtual(file)
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if regex.search(line):
            results.append(f"{virtual}:{number}:{line[:GREP_LINE_CHARS]}")
            if len(results) > GREP_CAP:
                return


LS = make_tool(ls, "ls")
GLOB = make_tool(glob, "glob")
GREP = make_tool(grep, "grep")
