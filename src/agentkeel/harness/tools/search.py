"""Finding things in the workspace: ``ls``, ``glob``, ``grep``.

All three walk the workspace without entering symlinked directories, so neither a link to ``/``
nor a symlink loop can make them leave the workspace or run forever; every result list is capped
so a huge tree cannot flood the model's context. A path (or glob pattern) under ``/skills`` searches
the read-only skills mount instead, with the same confinement.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information
from langchain_core.tools import ToolException

from agentkeel.harness.tools._support import (
    Runtime,
    filesystem,
    is_binary,
    make_tool,
    run_context,
    tool_errors,
)
from agentkeel.harness.tools.bounds import (
    Deadline,
    TimeLimitExceeded,
    off_loop,
    read_whole,
)
from agentkeel.sandbox.workspace import VIRTUAL_ROOT, PathOutsideWorkspace, Workspace

LS_CAP = 1_000
GLOB_CAP = 500
GLOB_MAX_SEGMENTS = 64
GREP_CAP = 200
GREP_LINE_CHARS = 500

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the model's tool error, not a line on stderr
_RE2_UNSUPPORTED = ("invalid perl operator", "invalid escape sequence", "invalid named capture group")


def _stopped_note(deadline: Deadline) -> str:
    return f"[... stopped: {deadline.message()}]"


async def ls(runtime: Runtime, path: str = VIRTUAL_ROOT) -> str:
    """List a workspace directory: sub-directories end with '/', symlinks with '@', files show size.

    Args:
        path: Directory path, either /workspace/... or relative to /workspace, or /skills/....
    """
    ctx = run_context(runtime)
    ws = filesystem(ctx, path)

    def work(deadline: Deadline) -> str:
        with tool_errors(path):
            real = ws.resolve(path)
            if not real.is_dir():
                raise ToolException(f"{path}: not a directory (use read_file for files)")
            entries: list[os.DirEntry[str]] = []
            with os.scandir(real) as scan:
                for entry in scan:
                    deadline.check()
                    entries.append(entry)
            entries.sort(key=lambda e: e.name)
            lines = []
            for entry in entries[:LS_CAP]:
                deadline.check()
                lines.append(_describe(entry))
        if len(entries) > LS_CAP:
            lines.append(f"[... {len(entries) - LS_CAP} more entries not shown]")
        return "\n".join(lines) if lines else f"{ws.to_virtual(real)} is empty"

    return await off_loop("ls", ctx.workspace_tool_timeout_s, work)


def _describe(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return f"{entry.name}@"
    if entry.is_dir(follow_symlinks=False):
        return f"{entry.name}/"
    return f"{entry.name}  ({entry.stat(follow_symlinks=False).st_size} bytes)"


async def glob(pattern: str, runtime: Runtime) -> str:
    """Find workspace files and directories whose path matches a glob pattern.

    Patterns are relative to /workspace: '*' and '?' stay within one path segment, '**' spans any
    number of directories (e.g. '**/*.py', 'outputs/*.md'). Results are sorted. A pattern starting
    with /skills/ searches the skills instead.

    Args:
        pattern: Glob pattern relative to /workspace, or starting with /skills/.
    """
    ctx = run_context(runtime)
    ws = filesystem(ctx, pattern)
    segments = _pattern_segments(pattern, ws.virtual_root)

    def work(deadline: Deadline) -> str:
        matches: list[str] = []
        stopped = False
        for entry, relative in ws.walk():
            if deadline.expired:
                stopped = True
                break
            if not _matches(segments, relative.split("/")):
                continue
            if entry.is_symlink() and not _stays_inside(ws, relative):
                continue
            matches.append(f"{ws.virtual_root}/{relative}")
        shown = matches[:GLOB_CAP]
        if len(matches) > GLOB_CAP:
            shown.append(f"[... {len(matches) - GLOB_CAP} more matches; narrow the pattern]")
        if stopped:
            shown.append(_stopped_note(deadline))
        return "\n".join(shown) if shown else f"No paths match {pattern!r}."

    return await off_loop("glob", ctx.workspace_tool_timeout_s, work)


def _pattern_segments(pattern: str, root: str) -> list[str]:
    """The pattern's segments below ``root`` (the searched tree's virtual root); patterns may not
    reach outside it."""
    relative = pattern
    if pattern == root or pattern.startswith(root + "/"):
        relative = pattern[len(root) :]
    elif pattern.startswith("/"):
        raise ToolException(f"glob pattern {pattern!r} must be relative to {VIRTUAL_ROOT}")
    segments = [s for s in relative.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise ToolException(f"glob pattern {pattern!r} may not contain '..'")
    if not segments:
        raise ToolException("glob pattern is empty")
    if len(segments) > GLOB_MAX_SEGMENTS:
        raise ToolException(f"glob pattern has {len(segments)} segments; at most {GLOB_MAX_SEGMENTS}")
    return segments


def _matches(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Segment-wise glob match, where a '**' segment stands for zero or more path segments.

    Memoised on (pattern index, path index): many '**' segments would otherwise try every way
    of splitting the path, exponential in their number.
    """

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(parts)
        if pattern[i] == "**":
            return any(match(i + 1, k) for k in range(j, len(parts) + 1))
        return j < len(parts) and fnmatchcase(parts[j], pattern[i]) and match(i + 1, j + 1)

    return match(0, 0)


def _stays_inside(ws: Workspace, relative: str) -> bool:
    try:
        ws.resolve(relative)
    except PathOutsideWorkspace:
        return False
    return True


async def grep(pattern: str, runtime: Runtime, path: str = VIRTUAL_ROOT) -> str:
    """Search text files for lines matching a regular expression (RE2 syntax).

    Each match is printed as 'path:line_number:line'. Binary and very large files are skipped.
    The syntax is Python's re without backreferences and lookaround (matching takes linear time);
    \\d, \\w and \\s match ASCII characters only.

    Args:
        pattern: Regular expression searched for in each line (case-sensitive; (?i) for ignore-case).
        path: File or directory to search, either /workspace/... or relative to /workspace, or /skills/....
    """
    ctx = run_context(runtime)
    ws = filesystem(ctx, path)

    def work(deadline: Deadline) -> str:
        regex = _compile(pattern)
        with tool_errors(path):
            real = ws.resolve(path)
            if not real.exists():
                raise FileNotFoundError(path)
        files: Iterator[Path] = iter([real])
        if real.is_dir():
            files = (Path(e.path) for e, _ in ws.walk(real) if e.is_file(follow_symlinks=False))
        results: list[str] = []
        for file in files:
            if deadline.expired or _grep_file(ws, file, regex, results, deadline):
                results.append(_stopped_note(deadline))
                break
            if len(results) > GREP_CAP:
                results = results[:GREP_CAP]
                results.append(f"[... stopped after {GREP_CAP} matches; narrow the pattern or path]")
                break
        return "\n".join(results) if results else f"No matches for {pattern!r}."

    return await off_loop("grep", ctx.workspace_tool_timeout_s, work)


def _compile(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        hint = ""
        if reason.startswith(_RE2_UNSUPPORTED):
            hint = " (grep matches in linear time with RE2, which has no backreferences or lookaround)"
        raise ToolException(f"invalid regular expression {pattern!r}: {reason}{hint}") from None


def _grep_file(
    ws: Workspace, file: Path, regex: Any, results: list[str], deadline: Deadline
) -> bool:
    """Append ``file``'s matching lines to ``results``; unreadable, binary and huge files are
    skipped. True when the deadline stopped the scan part-way."""
    try:
        data = read_whole(file, deadline)
    except TimeLimitExceeded:
        return True
    except OSError:
        return False
    if data is None or is_binary(data):
        return False
    virtual = ws.to_virtual(file)
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if deadline.expired:
            return True
        if regex.search(line):
            shown = line if len(line) <= GREP_LINE_CHARS else f"{line[:GREP_LINE_CHARS]} [... line cut]"
            results.append(f"{virtual}:{number}:{shown}")
            if len(results) > GREP_CAP:
                break
    return False


LS = make_tool(ls, "ls")
GLOB = make_tool(glob, "glob")
GREP = make_tool(grep, "grep")
