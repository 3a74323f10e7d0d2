"""Before/after diffs of a run's file changes, step by step, rebuilt from what the run recorded.

The journal's ``file.changed`` records hold hashes, not contents (contents are kept only in the
worker's in-memory snapshot, for a rollback). The contents can still be rebuilt: every step names
the tool call that made it, and the thread's checkpointed messages hold that call's arguments —
``write_file``'s whole new content (or what it appended), ``str_replace``'s old and new text. So a
file's text is replayed from a known start (empty for a file the run added) step by step, and each
result is checked against the step's recorded ``after_sha256``. A step whose result does not hash
to the record is not shown as if it were true: the text becomes unknown from there on.

When the start is unknown (the run modified a file that existed before it), a ``write_file`` step
still gives the whole text after it, and a ``str_replace`` step is shown as the fragment it
replaced (``diff_kind: fragment``). A ``bash`` step, or a subagent's step whose call is not in the
lead's thread, has no arguments to replay: its diff is ``null``, its hashes are still there. The
text after the run also comes from the workspace when the file there still hashes to the run's
``after_sha256``.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

MAX_DIFF_LINES = 400  # a diff longer than this is cut (and says so): the console shows, it does not archive

ToolArgs = Mapping[str, Mapping[str, Any]]  # tool call id -> {name, args}
FinalText = Callable[[str, str], str | None]  # (virtual path, sha256) -> the text, if the file still hashes to it


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_diffs(changes: list[dict[str, Any]], calls: ToolArgs, final_text: FinalText) -> list[dict[str, Any]]:
    """Each ``file.changed`` record (as ``/changes`` lists it) with a ``diff`` for the whole run
    and, on every step, a ``diff``, ``diff_kind`` (``full`` | ``fragment`` | null) and ``verified``
    (the replayed text hashes to the step's ``after_sha256``; null when nothing was replayed)."""
    return [_file(change, calls, final_text) for change in changes]


def _file(change: dict[str, Any], calls: ToolArgs, final_text: FinalText) -> dict[str, Any]:
    path = str(change.get("path") or "")
    start: str | None = "" if change.get("change") == "added" else None
    text = start
    steps = []
    for step in change.get("steps") or []:
        call = calls.get(str(step.get("tool_call_id") or ""))
        before = text
        after = _apply(call, before)
        verified = None
        if after is not None:
            verified = step.get("after_sha256") is None or sha256_text(after) == step.get("after_sha256")
        diff, kind = _step_diff(path, call, before, after if verified else None)
        steps.append({**step, "diff": diff, "diff_kind": kind, "verified": verified})
        text = after if verified else None
    end: str | None = "" if change.get("change") == "deleted" else text
    if end is None and change.get("after_sha256"):
        end = final_text(path, str(change["after_sha256"]))
    whole = _unified(path, start, end) if start is not None and end is not None else None
    return {**change, "steps": steps, "diff": whole,
            "before_known": start is not None, "after_known": end is not None}


def _apply(call: Mapping[str, Any] | None, before: str | None) -> str | None:
    """The file's text after ``call`` ran on ``before`` (None: not replayable)."""
    if call is None:
        return None
    args = call.get("args") or {}
    name = call.get("name")
    if name == "write_file" and isinstance(args.get("content"), str):
        if not args.get("append"):
            return str(args["content"])
        return None if before is None else before + str(args["content"])
    if name == "str_replace" and before is not None and isinstance(args.get("old"), str) and isinstance(args.get("new"), str):
        return before.replace(args["old"], args["new"], -1 if args.get("replace_all") else 1)
    return None


def _step_diff(path: str, call: Mapping[str, Any] | None, before: str | None, after: str | None) -> tuple[str | None, str | None]:
    if after is not None:
        return _unified(path, before if before is not None else "", after, unknown_before=before is None), "full"
    args = (call or {}).get("args") or {}
    if (call or {}).get("name") == "str_replace" and isinstance(args.get("old"), str) and isinstance(args.get("new"), str):
        return _unified(path, args["old"], args["new"], fragment=True), "fragment"
    return None, None


def _unified(path: str, before: str, after: str, *, unknown_before: bool = False, fragment: bool = False) -> str:
    label = "before (not recorded)" if unknown_before else "before"
    lines = list(difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"{path} ({'old text' if fragment else label})", tofile=f"{path} ({'new text' if fragment else 'after'})",
    ))
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more diff lines not shown\n"]
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
