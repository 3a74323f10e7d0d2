"""Fixtures of the browser end-to-end test: the ``useStream`` page built with npm, a static server
for it, a real ``keel serve``, and the system Chromium driven by Playwright.

The page and the API are served from two origins (two ports on 127.0.0.1), as a chat UI in
development is, so the browser enforces CORS exactly as it would for a user.

Build: ``npm ci`` when ``node_modules`` is missing or older than the lockfile, then ``npm run
build`` when ``dist/`` is older than any source; both are cached in ``tests/browser/app/`` (ignored
by git), so only the first run pays for them. Without node/npm or Chromium the test skips, and
fails under ``AGENTKEEL_REQUIRE_SERVICES=1``, like a missing PostgreSQL.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "gateway"))  # server_support

from server_support import KeelServer, free_port, start_server, write_project

APP = Path(__file__).parent / "app"
CHROMIUM = Path("/usr/bin/chromium")
# A name for 127.0.0.1 that is not a loopback name: a page served under it is "another site" to
# the gateway's default CORS policy, without a second server or network access.
FOREIGN_HOST = "chat.example"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    f"--host-resolver-rules=MAP {FOREIGN_HOST} 127.0.0.1",
]
SOURCES = ("package.json", "package-lock.json", "index.html", "src")


def _unavailable(config: pytest.Config, name: str, reason: str) -> None:
    """The suite's one rule for missing services (``tests/conftest.py``)."""
    root = config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
    root.service_unavailable(name, reason)


def _newest(paths: list[Path]) -> float:
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    return max(f.stat().st_mtime for f in files)


def _npm(*args: str) -> None:
    done = subprocess.run(["npm", *args], cwd=APP, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"npm {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@pytest.fixture(scope="session")
def page_dist(pytestconfig: pytest.Config) -> Path:
    """The built page (``dist/``), rebuilt only when a source is newer than it."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        _unavailable(pytestconfig, "Node.js", f"{' and '.join(missing)} not on PATH (needed to build the page)")
    installed = APP / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < (APP / "package-lock.json").stat().st_mtime:
        _npm("ci", "--no-audit", "--no-fund")
    built = APP / "dist" / "main.js"
    if not built.exists() or built.stat().st_mtime < _newest([APP / s for s in SOURCES]):
        _npm("run", "build")
    return APP / "dist"


@pytest.fixture(scope="module")
def page_url(page_dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The page, served by a static file server on its own port (its own origin)."""
    port = free_port()
    log = tmp_path_factory.mktemp("page") / "http.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(page_dist)],
            stdout=sink, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/index.html", timeout=1).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the page server did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def foreign_page_url(page_url: str) -> str:
    """The same page under ``FOREIGN_HOST`` (Chromium resolves it to 127.0.0.1)."""
    return page_url.replace("127.0.0.1", FOREIGN_HOST)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    """A real ``keel serve`` with the gateway tests' project (the scripted ``lead`` agent), its
    CORS settings left at their defaults: what a user gets."""
    server = start_server(write_project(tmp_path_factory.mktemp("keel-browser")))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's Chromium, headless, with a new empty profile (Playwright's own browsers are not
    downloadable here, and the system one is what CI installs).

    Module-scoped, never session: Playwright's sync API runs an event loop on this thread while
    it is open, and the asyncio tests of later modules cannot start theirs until it is closed."""
    if not CHROMIUM.exists():
        _unavailable(pytestconfig, "Chromium", f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
        )
        try:
            yield context
        finally:
            context.close()
