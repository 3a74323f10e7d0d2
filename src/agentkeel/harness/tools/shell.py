"""The ``bash`` tool: a shell command in the workspace, off unless the run enables it.

A command can change any file, so the change ledger is fed by comparing a cheap listing of the
workspace (size and mtime per path) taken before and after the command, reported even when the
command times out or is cancelled part-way.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias

from langchain_core.tools import ToolException

from agentkeel.harness.tools._support import Runtime, make_tool, report_touch, run_context
from agentkeel.sandbox.exec import run_command
from agentkeel.sandbox.workspace import VIRTUAL_ROOT, Workspace

LISTING_MAX_ENTRIES = 20_000
"""Above this many files the before/after diff is skipped and the whole workspace is reported."""

Listing: TypeAlias = dict[str, tuple[int, int]] | None


async def bash(command: str, runtime: Runtime, timeout_s: float | None = None) -> str:
    """Run a bash command with /workspace as the working directory.

    The environment is minimal (PATH, HOME=/workspace, LANG). stdout and stderr are returned
    together; long output is cut in the middle. Processes the command leaves running in the
    background are killed when it finishes.

    Args:
        command: The bash command line to run.
        timeout_s: Seconds before the command is killed; capped by the run's limit.
    """
    ctx = run_context(runtime)
    if not ctx.bash_enabled:
        raise ToolException("bash is disabled for this run")
    if timeout_s is not None and timeout_s <= 0:
        raise ToolException(f"timeout_s must be positive, got {timeout_s}")
    limit = ctx.bash_timeout_s if timeout_s is None else min(timeout_s, ctx.bash_timeout_s)
    ws = Workspace(ctx.workspace_root)
    before = await asyncio.to_thread(ws.listing, LISTING_MAX_ENTRIES)
    registry = ctx.processes
    try:
        result = await run_command(
            command,
            ws.real_root,
            limit,
            ctx.bash_output_cap,
            on_start=registry.register if registry is not None else None,
            on_exit=registry.unregister if registry is not None else None,
            sandbox=ctx.bash_sandbox,
        )
    finally:
        after = await asyncio.to_thread(ws.listing, LISTING_MAX_ENTRIES)
        for virtual in changed_paths(before, after):
            report_touch(runtime, virtual, "bash")
    if result.timed_out:
        raise ToolException(
            _with_note(
                result.output,
                f"timed out after {limit:g}s; the command and its processes were killed",
            )
        )
    if result.exit_code < 0:
        return _with_note(result.output, f"killed by signal {-result.exit_code}")
    return _with_note(result.output, f"exit code {result.exit_code}")


def _with_note(output: str, note: str) -> str:
    """The command's output followed by a bracketed status line the model cannot mistake for it."""
    if not output:
        return f"(no output)\n[{note}]"
    separator = "" if output.endswith("\n") else "\n"
    return f"{output}{separator}[{note}]"


def changed_paths(before: Listing, after: Listing) -> list[str]:
    """Virtual paths added, removed or modified between two listings, sorted.

    When either listing was skipped as too large, the whole workspace is reported as changed: vague,
    but never silently missing a change.
    """
    if before is None or after is None:
        return [VIRTUAL_ROOT]
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    return [f"{VIRTUAL_ROOT}/{path}" for path in sorted(changed)]


BASH = make_tool(bash, "bash")
