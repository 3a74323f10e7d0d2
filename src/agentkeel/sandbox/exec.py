"""Running a shell command for an agent: bounded in time and output, and never leaving strays.

Every command gets its own process group, so "kill the command" means killing everything it
started (pipelines, background jobs), whether the reason is a timeout, the awaiting task being
cancelled, or the run being cancelled from outside through a :class:`ProcessGroupRegistry`.
When the command's shell exits, whatever it left running in its group is killed too: a tool call
must not leave processes behind that outlive the run and that nobody tracks.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentkeel.sandbox.bwrap import BashSandbox, command_env

TERM_GRACE_S = 2.0
"""How long a timed-out command may take to exit on SIGTERM before its group gets SIGKILL."""

_DRAIN_S = 1.0
"""How long to wait for the output pipe to close once the command's group has been killed.

Only a process that escaped the group (``setsid``) can keep it open; its output is then dropped.
"""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    """The shell's exit status; negative (``-signal``) when it was killed."""
    output: str
    """stdout and stderr interleaved as written, head and tail kept when over the cap."""
    timed_out: bool
    truncated: bool


class ProcessGroupRegistry:
    """The process groups of one run's live commands, so cancelling the run can kill them.

    Thread-safe because a cancel may arrive from a different thread than the one running the tools.
    """

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._lock = threading.Lock()

    def register(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)

    def unregister(self, pid: int) -> None:
        with self._lock:
            self._pids.discard(pid)

    def kill_all(self) -> int:
        """SIGKILL every registered process group; returns how many were still alive.

        The registry is emptied: a group id is only meaningful while its leader lives, and
        signalling it again later could hit an unrelated process that reused the id.
        """
        with self._lock:
            pids, self._pids = self._pids, set()
        return sum(kill_group(pid, signal.SIGKILL) for pid in pids)


def kill_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class _HeadTail:
    """Collects a stream keeping its first and last bytes, so a noisy command cannot flood memory.

    Both ends are kept because the head shows what a command started doing and the tail how it ended
    (errors and summaries usually come last).
    """

    def __init__(self, cap: int) -> None:
        self._head_cap = max(cap, 0) // 2
        self._tail_cap = max(cap, 0) - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0

    def feed(self, chunk: bytes) -> None:
        self._total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        excess = len(self._tail) - self._tail_cap
        if excess > 0:
            del self._tail[:excess]

    def text(self) -> tuple[str, bool]:
        """The collected output and whether anything was dropped from its middle."""
        omitted = self._total - len(self._head) - len(self._tail)
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if omitted == 0:
            return head + tail, False
        return f"{head}\n[... {omitted} bytes of output omitted ...]\n{tail}", True


class _CommandProtocol(asyncio.SubprocessProtocol):
    """Feeds output to the collector and reports the shell's exit separately from pipe closure.

    ``Process.wait()`` of the high-level API only returns once every pipe is closed, which a
    background job holding stdout delays until the timeout; the shell's own exit is what decides
    when the command is over.
    """

    def __init__(self, collector: _HeadTail) -> None:
        loop = asyncio.get_running_loop()
        self.collector = collector
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.collector.feed(data if isinstance(data, bytes) else data.encode())

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def run_command(
    command: str,
    cwd: Path,
    timeout_s: float,
    output_cap: int,
    on_start: Callable[[int], None] | None = None,
    on_exit: Callable[[int], None] | None = None,
    sandbox: BashSandbox | None = None,
) -> CommandResult:
    """Run ``bash -c command`` in ``cwd`` (also its HOME) in a new process group.

    ``output_cap`` bounds the returned output in bytes (head and tail kept). After ``timeout_s``
    the group gets SIGTERM, then SIGKILL after :data:`TERM_GRACE_S`. If the awaiting task is
    cancelled the group is killed at once and the cancellation propagates. ``on_start`` and
    ``on_exit`` receive the group id (the shell's pid) so a registry can track the command while
    it lives. With a ``sandbox`` the command runs inside bubblewrap (see :mod:`.bwrap`); the group
    is then bwrap's, and killing it kills bwrap, whose pid namespace takes every process with it.
    """
    collector = _HeadTail(output_cap)
    argv = ["bash", "-c", command]
    if sandbox is not None:
        await asyncio.to_thread(sandbox.prepare, cwd)
        argv = sandbox.argv(command, cwd)
    transport, protocol = await asyncio.get_running_loop().subprocess_exec(
        lambda: _CommandProtocol(collector),
        *argv,
        cwd=cwd,
        env=command_env(cwd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pgid = transport.get_pid()
    timed_out = False
    try:
        if on_start is not None:
            on_start(pgid)
        done, _ = await asyncio.wait({protocol.exited}, timeout=timeout_s)
        if not done:
            timed_out = True
            kill_group(pgid, signal.SIGTERM)
            await asyncio.wait({protocol.exited}, timeout=TERM_GRACE_S)
        kill_group(pgid, signal.SIGKILL)
        await protocol.exited
        await asyncio.wait({protocol.closed}, timeout=_DRAIN_S)
    except BaseException:
        kill_group(pgid, signal.SIGKILL)
        raise
    finally:
        transport.close()
        if on_exit is not None:
            on_exit(pgid)
    exit_code = transport.get_returncode()
    assert exit_code is not None
    output, truncated = collector.text()
    return CommandResult(
        exit_code=exit_code, output=output, timed_out=timed_out, truncated=truncated
    )
