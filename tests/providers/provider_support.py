"""The provider stubs as real processes, and the fixtures that hand them to tests.

Each stub (``stub_openai.py``, ``stub_anthropic.py``) runs in its own process on a port it binds
itself (it prints ``PORT <n>``, so there is no race for a "free" port), is shared by the session
(start-up costs a second of imports) and reset before every test that asks for it; it is stopped by
its PID. ``StubServer`` is the test's handle: script the next responses, read what was received.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).parent
STUB_KEY_ENV = "STUB_KEY"
STUB_KEY = "sk-stub-test-key"


@dataclass
class StubServer:
    """One running stub process."""

    provider: str  # "openai" | "anthropic"
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What a model config's ``base_url`` is: OpenAI clients append ``/chat/completions`` to a
        ``/v1`` base, Anthropic clients append ``/v1/messages`` to the bare host."""
        return f"{self.url}/v1" if self.provider == "openai" else self.url

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            response = http.request(method, path, json=payload)
            response.raise_for_status()
            return response.json()

    def script(self, *steps: dict[str, Any]) -> None:
        """Queue responses (see ``stub_core`` for a step's keys), answered in order."""
        self._call("POST", "/_script", list(steps))

    def reset(self) -> None:
        self._call("POST", "/_reset")

    def requests(self) -> list[dict[str, Any]]:
        """Every request received since the last reset: ``path``, ``headers``, ``body``,
        ``violations`` (what the strict validation refused) and ``answered``."""
        return list(self._call("GET", "/_requests"))

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests()]

    def served_usage(self) -> dict[str, int]:
        """The token counts the stub reported over every successful answer since the reset."""
        total = {"input": 0, "output": 0}
        for entry in self.requests():
            usage = (entry.get("answered") or {}).get("usage")
            if usage:
                total["input"] += usage["input"]
                total["output"] += usage["output"]
        return total

    def violations(self) -> list[str]:
        return [v for r in self.requests() for v in r["violations"]]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)


def start_stub(provider: str, timeout: float = 20.0) -> StubServer:
    """Start ``stub_<provider>.py`` and return once it answers ``/_health``."""
    # Only the PORT line goes to the pipe (nobody reads it afterwards); logs go to a file.
    log = Path(tempfile.gettempdir()) / f"stub_{provider}_{os.getpid()}.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, str(HERE / f"stub_{provider}.py"), "--port", "0"], stdout=subprocess.PIPE, stderr=sink,
        )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    try:
        port = 0
        while not port:
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = process.stdout.readline().decode() if ready else ""
            if line.startswith("PORT "):
                port = int(line.split()[1])
            elif process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stub_{provider} did not start: {line}{log.read_text(errors='replace')}")
        stub = StubServer(provider=provider, port=port, process=process)
        while True:
            try:
                if httpx.get(f"{stub.url}/_health", timeout=1).status_code == 200:
                    return stub
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"stub_{provider} does not answer /_health")
            time.sleep(0.05)
    except BaseException:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        raise


@pytest.fixture(scope="session")
def openai_stub_process() -> Iterator[StubServer]:
    stub = start_stub("openai")
    yield stub
    stub.stop()


@pytest.fixture(scope="session")
def anthropic_stub_process() -> Iterator[StubServer]:
    stub = start_stub("anthropic")
    yield stub
    stub.stop()


@pytest.fixture
def openai_stub(openai_stub_process: StubServer) -> StubServer:
    """The session's OpenAI-compatible stub, with an empty queue and log."""
    openai_stub_process.reset()
    return openai_stub_process


@pytest.fixture
def anthropic_stub(anthropic_stub_process: StubServer) -> StubServer:
    """The session's Anthropic-compatible stub, with an empty queue and log."""
    anthropic_stub_process.reset()
    return anthropic_stub_process


@pytest.fixture
def stub_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The key variable the test configs name (``api_key_env: STUB_KEY``), set for this test."""
    monkeypatch.setenv(STUB_KEY_ENV, STUB_KEY)
    return STUB_KEY
