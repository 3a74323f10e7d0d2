"""Huge tool results go to the workspace; the context gets a bounded excerpt that says where.

A single ``cat`` of a log or a verbose command can be larger than everything else in the context
together, and it stays in the history of every later call. A result longer than
``externalize_min_chars`` is written in full to ``<storage_dir>/<tool>-<12 hex>.txt`` inside the
workspace and replaced by an excerpt: one line naming the file, its size and how to read the
rest with ``read_file``, then the head, an omission marker and the tail. Nothing is lost — the
model can page through the file — and the context cost is bounded by ``externalize_min_chars``.

Why the workspace gate: ``storage_dir`` is a ``/workspace/...`` path resolved through
:meth:`Workspace.resolve`, so neither the configuration nor a symlink planted by a command can
make the guard write outside the thread's workspace. If the file cannot be written (or the run
has no context), the result is still cut to head and tail, and the journal says why: the bound
holds either way.

Why ``observes_final`` on the tool result: it must budget the text the model will actually read,
after every other guard changed it (sanitisation), so it is the outermost of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.middleware.base import KeelMiddleware, ToolHandler, run_context
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import map_tool_messages
from agentkeel.harness.middleware.sanitize import block_text
from agentkeel.limits import ToolOutputLimits
from agentkeel.sandbox.workspace import Workspace

CHARS_PER_TOKEN = 4
"""The rough estimate behind the "~tokens" figure the model is shown."""

_NEAR = 0.25  # a cut moves to a line boundary when one lies within this fraction of its length
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]+")


def safe_tool_name(tool: str) -> str:
    """``tool`` as a plain file-name component (no separators, no dots)."""
    return _UNSAFE_NAME.sub("_", tool).strip("_")[:64] or "tool"


def plain_text(content: Any) -> str | None:
    """The text of ``content`` if it is only text (a string or text blocks), else None."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    parts = [block_text(block) for block in content]
    return None if any(p is None for p in parts) else "".join(str(p) for p in parts)


def line_count(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _cuts(text: str, head_chars: int, tail_chars: int) -> tuple[int, int]:
    """(end of head, start of tail), each moved to a nearby line boundary when there is one."""
    head_end = min(head_chars, len(text))
    newline = text.rfind("\n", 0, head_end)
    if newline >= 0 and head_end - (newline + 1) <= head_chars * _NEAR:
        head_end = newline + 1
    tail_start = max(len(text) - tail_chars, head_end)
    newline = text.find("\n", tail_start, tail_start + int(tail_chars * _NEAR))
    if newline >= 0:
        tail_start = newline + 1
    return head_end, tail_start


def _marker(omitted: int, first_line: int, last_line: int) -> str:
    return f"[... {omitted:,} chars omitted (lines {first_line:,}-{last_line:,}) ...]"


def excerpt(text: str, header: str, limits: ToolOutputLimits) -> str:
    """``header``, the head of ``text``, an omission marker and the tail, never longer than
    ``limits.externalize_min_chars`` (head and tail shrink in proportion when the header and
    marker need the room). ``text`` that already fits is returned as is."""
    limit = limits.externalize_min_chars
    if len(text) <= limit:
        return text
    lines = line_count(text)
    # Room for head + tail, with the marker at its longest possible length.
    room = max(0, limit - len(header) - len(_marker(len(text), lines, lines)) - 3)
    head_chars, tail_chars = limits.head_chars, limits.tail_chars
    if head_chars + tail_chars > room:
        head_chars = room * head_chars // (head_chars + tail_chars)
        tail_chars = room - head_chars
    head_end, tail_start = _cuts(text, head_chars, tail_chars)
    marker = _marker(
        tail_start - head_end,
        text.count("\n", 0, head_end) + 1,
        text.count("\n", 0, max(tail_start - 1, head_end)) + 1,
    )
    out = f"{header}\n{text[:head_end]}\n{marker}\n{text[tail_start:]}"
    return out[:limit]


def saved_header(tool: str, path: str, text: str) -> str:
    chars = len(text)
    return (
        f"[The full output of {tool} ({chars:,} chars, ~{chars // CHARS_PER_TOKEN:,} tokens, "
        f"{line_count(text):,} lines) was saved to {path}. Only its start and end are shown below; "
        f'read the rest with read_file(path="{path}", start_line=..., end_line=...).]'
    )


def cut_header(tool: str, text: str) -> str:
    chars = len(text)
    return (
        f"[The output of {tool} ({chars:,} chars, ~{chars // CHARS_PER_TOKEN:,} tokens) was too "
        "long and could not be written to the workspace; only its start and end are shown below.]"
    )


def save_output(workspace_root: Path, storage_dir: str, tool: str, text: str) -> str:
    """Write ``text`` under ``storage_dir`` (a workspace path) and return its ``/workspace`` path.

    Raises ``OSError`` (including :class:`PathOutsideWorkspace`) or ``ValueError`` on failure.
    """
    ws = Workspace(workspace_root)
    folder = ws.resolve(storage_dir)
    folder.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8", errors="replace")
    name = f"{safe_tool_name(tool)}-{hashlib.sha256(data).hexdigest()[:12]}.txt"
    target = ws.resolve(f"{ws.to_virtual(folder)}/{name}")
    target.write_bytes(data)
    return ws.to_virtual(target)


class ToolOutputBudget(KeelMiddleware):
    """Externalises oversized tool results and leaves a bounded excerpt in their place."""

    contract: ClassVar[Contract] = Contract(
        axes={"tool": on(mutates={"tool_result"}, observes_final={"tool_result"})},
    )

    def __init__(self, limits: ToolOutputLimits) -> None:
        super().__init__()
        self.limits = limits
        self._exempt = frozenset(limits.exempt_tools)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolMessage | Command[Any]:
        result = await handler(request)
        tool = str(request.tool_call.get("name", ""))
        if not self.limits.enabled or tool in self._exempt:
            return result
        ctx = run_context(request.runtime)
        events: list[tuple[str, str, dict[str, Any]]] = []

        def budget(message: ToolMessage) -> ToolMessage:
            text = plain_text(message.content)
            if text is None or len(text) <= self.limits.externalize_min_chars:
                return message
            name = safe_tool_name(tool)
            facts: dict[str, Any] = {"tool": tool, "tool_call_id": message.tool_call_id, "chars": len(text)}
            try:
                if ctx is None:
                    raise LookupError("no run context")
                path = save_output(ctx.workspace_root, self.limits.storage_dir, tool, text)
            except (OSError, ValueError, LookupError) as exc:
                events.append(("truncated", f"{tool} output could not be saved ({type(exc).__name__}: {exc}); "
                               "cut to head and tail", facts))
                return message.model_copy(update={"content": excerpt(text, cut_header(name, text), self.limits)})
            events.append(("externalized", f"{tool} output saved to {path}", {**facts, "path": path}))
            return message.model_copy(update={"content": excerpt(text, saved_header(name, path, text), self.limits)})

        if not _any_oversized(result, self.limits.externalize_min_chars):
            return result  # the common case, without a thread hop
        # File I/O (and slicing megabytes of text) stays off the event loop.
        budgeted = await asyncio.to_thread(map_tool_messages, result, budget)
        for action, detail, data in events:
            self.intervene(request.runtime, action, detail, **data)
            if action == "externalized" and ctx is not None and ctx.touches is not None:
                # The change ledger says which step produced the file: the call whose output it is.
                ctx.touches.touched(data["path"], data["tool_call_id"], self.name)
        return budgeted


def _any_oversized(result: Any, limit: int) -> bool:
    found = False

    def probe(message: ToolMessage) -> ToolMessage:
        nonlocal found
        text = plain_text(message.content)
        found = found or (text is not None and len(text) > limit)
        return message

    map_tool_messages(result, probe)
    return found


__all__ = [
    "CHARS_PER_TOKEN",
    "ToolOutputBudget",
    "cut_header",
    "excerpt",
    "line_count",
    "plain_text",
    "safe_tool_name",
    "save_output",
    "saved_header",
]
