"""A private ``redis-server`` a test may stop, pause and restart (never the shared one).

Started with persistence off (``--save "" --appendonly no``), so a restart loses every key, as a
cache-only production Redis does; bound to 127.0.0.1 on a free port, stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError(f"private redis-server on port {self.port} did not start")

    def kill(self) -> None:
        """Stop it abruptly (SIGKILL): every key is lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung or half-open server)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.resume()
        server.kill()
