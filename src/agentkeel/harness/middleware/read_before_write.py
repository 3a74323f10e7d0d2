"""ReadBeforeWrite: an existing file may only be changed by a model that has seen its current bytes.

Why: an agent that writes without reading back repeats itself. In DeerFlow #3857 a weekly-report
agent appended the same "US" section five times; whether a write was safe depended entirely on the
model's self-check. This guard makes it a precondition instead.

How: a successful ``read_file`` result is stamped with ``READ_MARK = {path, sha256}``, the hash the
tool computed of exactly the bytes it read (always the whole file, also for a ranged read). Writing
(``write_file``, overwrite or append) or editing (``str_replace``) an EXISTING file needs the newest
mark for that path among the graph state's messages to equal the hash of the file's current bytes.
Writes never stamp, so every write invalidates earlier reads. Marks live on messages, and only the
messages the model is still sent count: a read in the compacted part of a thread (before the cut of
the state's ``compaction``, :func:`agentkeel.harness.compaction.kept_from`) no longer authorises a
write, although the thread keeps the message. New files pass.

The parallel tool calls of one AI message run concurrently and see the same state, so the check and
the write run under one lock per (thread, path): two appends cannot both pass on one mark. Reads take
the same lock, so a mark never describes bytes that a concurrent write was changing. The locks are
module-level weak values: shared by every concurrent call, gone once nobody holds them.

Fail-open: when the current file cannot be inspected for a reason other than not existing, the write
goes through and the reason is journaled; a guard that cannot see must not stop the agent working.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentkeel.harness.compaction import kept_from
from agentkeel.harness.durable import Compaction, durable_values
from agentkeel.harness.middleware.base import KeelMiddleware, ToolHandler, run_context
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import READ_MARK, TOOL_META, fingerprint
from agentkeel.harness.tools.bounds import Deadline, file_sha256, off_loop
from agentkeel.sandbox.workspace import Workspace

READ_TOOL = "read_file"
GATED_TOOLS = frozenset({"write_file", "str_replace"})

_LOCKS: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()


def path_lock(thread_id: str, virtual_path: str) -> asyncio.Lock:
    """The lock serialising reads and gated writes of one path in one thread."""
    key = (thread_id, virtual_path)
    lock = _LOCKS.get(key)
    if lock is None:
        lock = asyncio.Lock()
        _LOCKS[key] = lock
    return lock


def locate(ws: Workspace, path: str) -> tuple[str, Path] | None:
    """``(virtual path, real path)`` of ``path``, or None when it does not resolve in the workspace.

    The virtual path is the single key of a file: ``notes/a.md``, ``/workspace/notes/a.md`` and
    ``/workspace/./notes/../notes/a.md`` all give ``/workspace/notes/a.md``.
    """
    try:
        real = ws.resolve(path)
        return ws.to_virtual(real), real
    except (OSError, ValueError):  # PathOutsideWorkspace is a PermissionError
        return None


def current_sha256(real: Path, deadline: Deadline | None = None) -> str | None:
    """sha256 of the file's bytes now, or None when it does not exist (any other failure raises).

    Hashed in chunks, so a huge file is never held in memory; a FIFO is refused, never waited on.
    """
    try:
        return file_sha256(real, deadline)
    except FileNotFoundError:
        return None


def newest_mark(messages: Sequence[Any], virtual_path: str, compaction: Compaction | None = None) -> str | None:
    """The hash in the newest read mark for ``virtual_path`` among the messages ``compaction``
    keeps (all of them when nothing is compacted), if any."""
    for message in reversed(messages[kept_from(messages, compaction):]):
        if isinstance(message, ToolMessage):
            mark = message.additional_kwargs.get(READ_MARK)
            if isinstance(mark, dict) and mark.get("path") == virtual_path:
                sha = mark.get("sha256")
                return sha if isinstance(sha, str) else None
    return None


def blocked_message(tool: str, virtual_path: str, tool_call_id: str) -> ToolMessage:
    """The error result a blocked write gets instead of running."""
    content = (
        f"Error: {tool} blocked: {virtual_path} already exists and you have not read its current "
        "version. Every write invalidates earlier reads. Read it with read_file (a ranged read such "
        "as the last 30 lines is enough before an append), check what is already there, then retry."
    )
    meta = {
        "status": "error",
        "error_type": "stale_read",
        "source": "ReadBeforeWrite",
        "fingerprint": fingerprint(content),
    }
    return ToolMessage(
        content=content, name=tool, tool_call_id=tool_call_id, status="error",
        additional_kwargs={TOOL_META: meta},
    )


def _state_messages(state: Any) -> list[Any]:
    if isinstance(state, Mapping):
        return list(state.get("messages") or [])
    return list(getattr(state, "messages", None) or [])


class ReadBeforeWrite(KeelMiddleware):
    """Blocks writes to existing files whose current version the model has not read."""

    contract: ClassVar[Contract] = Contract(
        axes={
            "tool": on(
                reads={"tool_request.args", "tool_result"},
                mutates={"tool_result", "tool_result.read_mark"},
            )
        },
        # A lead's is a switch (``limits.read_before_write``); nobody reviews a subagent's writes.
        mandatory_for=frozenset({"subagent"}),
    )

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: ToolHandler
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        name = call.get("name")
        path = (call.get("args") or {}).get("path")
        ctx = run_context(request.runtime)
        if (name != READ_TOOL and name not in GATED_TOOLS) or not isinstance(path, str) or ctx is None:
            return await handler(request)
        located = locate(Workspace(ctx.workspace_root), path)
        if located is None:  # outside the workspace: the tool itself refuses it
            return await handler(request)
        virtual, real = located
        async with path_lock(ctx.thread_id, virtual):
            if name == READ_TOOL:
                return await self._stamped(await handler(request), virtual, real, call.get("id"))
            blocked = await self._gate(request, name, virtual, real, ctx.workspace_tool_timeout_s)
            return blocked if blocked is not None else await handler(request)

    async def _gate(
        self, request: ToolCallRequest, tool: str, virtual: str, real: Path, limit_s: float
    ) -> ToolMessage | None:
        """None when the write may run, else the error result that replaces it (hashing the file
        within the run's time limit of workspace tools; past it the write is let through)."""
        call_id = request.tool_call.get("id") or ""
        try:
            current = await off_loop(tool, limit_s, lambda deadline: current_sha256(real, deadline))
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self.intervene(
                request.runtime, "fail_open",
                f"{tool} on {virtual} allowed: the current file could not be inspected ({reason})",
                tool=tool, path=virtual, tool_call_id=call_id, reason=reason,
            )
            return None
        if current is None:  # a new file (str_replace reports a missing file itself)
            return None
        mark = newest_mark(_state_messages(request.state), virtual, durable_values(request.state)["compaction"])
        if mark == current:
            return None
        reason = "unread" if mark is None else "stale"
        self.intervene(
            request.runtime, "blocked",
            f"{tool} on {virtual} blocked: "
            + ("no read of it in context" if mark is None else "it changed since the last read"),
            tool=tool, path=virtual, tool_call_id=call_id, reason=reason,
        )
        return blocked_message(tool, virtual, call_id)

    async def _stamped(
        self, result: ToolMessage | Command[Any], virtual: str, real: Path, call_id: str | None
    ) -> ToolMessage | Command[Any]:
        """``result`` with the read mark on the read's ToolMessage (also inside a Command)."""
        if isinstance(result, ToolMessage):
            return await self._stamp(result, virtual, real)
        if isinstance(result, Command) and isinstance(result.update, dict):
            messages = list(result.update.get("messages") or [])
            for index in range(len(messages) - 1, -1, -1):
                message = messages[index]
                if isinstance(message, ToolMessage) and message.tool_call_id == call_id:
                    messages[index] = await self._stamp(message, virtual, real)
                    return dataclasses.replace(result, update={**result.update, "messages": messages})
        return result

    async def _stamp(self, message: ToolMessage, virtual: str, real: Path) -> ToolMessage:
        if message.status == "error":
            return message
        artifact = message.artifact if isinstance(message.artifact, dict) else {}
        sha = artifact.get("sha256")
        if not isinstance(sha, str):
            # A reader without the artifact: we hold the path lock, so no gated write intervened.
            try:
                sha = await asyncio.to_thread(current_sha256, real)
            except Exception:
                sha = None
            if sha is None:
                return message
        mark = {"path": virtual, "sha256": sha}
        kwargs = {**message.additional_kwargs, READ_MARK: mark}
        return message.model_copy(update={"additional_kwargs": kwargs})


__all__ = [
    "GATED_TOOLS",
    "READ_TOOL",
    "ReadBeforeWrite",
    "blocked_message",
    "current_sha256",
    "locate",
    "newest_mark",
    "path_lock",
]
