"""The web console in headless Chromium against a real ``keel serve`` with API keys on.

A live run is watched to its END: stop reasons, the waterfall with its subagent nested and the
run's checkpoints and attempt on it, no divergence, the charts, the file diffs by step and the
chain manifest, all checked against the API. A running run is
interrupted with the page's button; another is rolled back once the page has asked. A page without
a key says so, then works with one. No JavaScript error may occur, and every page leaves a
screenshot in the artefact directory (printed)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_support import APPENDIX, REPORT, write_console_project
from server_support import KeelServer, start_server

TIMEOUT_MS = 30_000
ALICE, ROOT = "alice-console-key-0123456789", "root-console-key-9876543210"
AUTH = {"mode": "api_keys", "api_keys": [{"user": "alice", "key_env": "KEEL_CONSOLE_ALICE"},
                                         {"user": "root", "key_env": "KEEL_CONSOLE_ROOT", "permissions": ["admin"]}]}
# Chromium reports every failed fetch on the console ("Failed to load resource: ... 401"); only
# the test that opens the page without a key expects those.
RESOURCE_401 = "the server responded with a status of 401"


@pytest.fixture(scope="module")
def artefacts() -> Path:
    """Screenshots go here: ``AGENTKEEL_ARTEFACTS`` if set, else a new directory under the tmp dir."""
    root = Path(os.environ.get("AGENTKEEL_ARTEFACTS") or tempfile.mkdtemp(prefix="agentkeel-console-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {root}")
    return root


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    config = write_console_project(tmp_path_factory.mktemp("keel-console"), auth=AUTH)
    server = start_server(config, env_extra={"KEEL_CONSOLE_ALICE": ALICE, "KEEL_CONSOLE_ROOT": ROOT})
    yield server
    server.stop()


def _open(browser: Any, url: str, key: str | None) -> Any:
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.problems = []
    page.on("pageerror", lambda error: page.problems.append(f"page error: {error}"))
    page.on("console", lambda message: page.problems.append(f"console {message.type}: {message.text}")
            if message.type == "error" else None)
    if key is not None:  # as if typed into the key field in this tab before (sessionStorage)
        page.add_init_script(f"sessionStorage.setItem('agentkeel.credential', {key!r})")
    page.goto(url)
    return page


def _start(server: KeelServer, key: str, owner: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"x-api-key": key}
    thread = httpx.post(f"{server.url}/threads", json={"metadata": {"owner": owner}}, headers=headers).json()
    run = httpx.post(f"{server.url}/threads/{thread['thread_id']}/runs", json=body, headers=headers)
    assert run.status_code == 200, run.text
    return dict(run.json())


def _api(server: KeelServer, path: str) -> Any:
    answer = httpx.get(f"{server.url}{path}", headers={"x-api-key": ALICE})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_live_run_is_watched_to_its_end(browser: Any, console_server: KeelServer, artefacts: Path) -> None:
    page = _open(browser, f"{console_server.url}/console", ALICE)
    try:
        # Pending for a second, so the page is open before the run does anything.
        run = _start(console_server, ALICE, "alice", {"assistant_id": "lead", "input": "write the report",
                                                       "context": {"model_name": "console"}, "after_seconds": 1})
        page.locator(f"[data-testid=runs] tr[data-run-id='{run['run_id']}'] a").click(timeout=TIMEOUT_MS)
        page.locator("[data-testid=live][data-state=live]").wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artefacts / "console-run-live.png"), full_page=True)
        page.locator("[data-testid=live][data-state=end]").wait_for(timeout=TIMEOUT_MS)
        page.locator("[data-testid=run-status]", has_text="success").wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artefacts / "console-run-end.png"), full_page=True)

        base = f"/threads/{run['thread_id']}/runs/{run['run_id']}"
        record = _api(console_server, base)
        codes = [reason["code"] for reason in record["stop_reasons"]]
        assert codes == ["token_capped"] and record["stop_reason"] == "token_capped"
        assert page.locator("[data-testid=stop-reasons] li").evaluate_all("items => items.map(i => i.dataset.code)") == codes
        assert page.get_by_test_id("primary-stop-reason").text_content() == "token_capped"
        assert page.get_by_test_id("outcome").text_content() == "success, capped or stopped by a guard"
        head = httpx.get(f"{console_server.url}/threads/{run['thread_id']}/state", headers={"x-api-key": ALICE}).json()
        assert head["checkpoint"]["checkpoint_id"] in str(page.get_by_test_id("resume").text_content())
        assert str(record["usage"]["total_tokens"]) in str(page.get_by_test_id("tokens").text_content())

        changes = {change["path"]: change for change in _api(console_server, f"{base}/changes")}
        files = page.locator("[data-testid=changes] article")
        assert sorted(files.evaluate_all("items => items.map(i => i.dataset.path)")) == sorted(changes) == [APPENDIX, REPORT]
        report = page.locator(f"[data-testid=changes] article[data-path='{REPORT}']")
        steps = report.locator(".file-steps > li")
        assert steps.evaluate_all("items => items.map(i => i.dataset.toolCallId)") == [
            step["tool_call_id"] for step in changes[REPORT]["steps"]]
        assert "+line two" in str(steps.nth(0).locator(".diff").text_content())
        second = str(steps.nth(1).locator(".diff").text_content())
        assert "-line two" in second and "+line 2" in second
        assert "verified against the recorded hash" in str(steps.nth(1).text_content())
        appendix = page.locator(f"[data-testid=changes] article[data-path='{APPENDIX}']")
        assert "+appendix" in str(appendix.locator("details .diff").text_content())  # the run's whole diff

        # The subagent nests under the lead's task call, and its own calls under it.
        subagent = page.locator("[data-testid=waterfall] .step[data-kind=subagent]")
        assert subagent.count() == 1 and subagent.get_attribute("data-depth") == "1"
        depths = page.locator("[data-testid=waterfall] .step").evaluate_all(
            "rows => rows.map(r => [r.dataset.kind, r.textContent.includes('general-purpose') || r.dataset.depth === '2', r.dataset.depth])")
        assert any(kind == "model" and depth == "2" for kind, _child, depth in depths)
        assert page.locator("[data-testid=waterfall] .step[data-kind=stop_reason]").count() == 1
        # The aligned timeline: the run's checkpoints and attempt on the same axis, and no divergence.
        aligned = _api(console_server, f"{base}/timeline")
        checkpoints = page.locator("[data-testid=waterfall] .step[data-kind=checkpoint]")
        assert checkpoints.count() == len([i for i in aligned["items"] if i["source"] == "checkpoint"]) > 0
        assert page.locator("[data-testid=attempts] li[data-attempt]").count() == 1
        assert page.get_by_test_id("no-divergence").is_visible() and aligned["divergences"] == []
        callers = page.locator("[data-testid=spend-chart] path[data-caller]").evaluate_all("ps => ps.map(p => p.dataset.caller)")
        assert set(callers) >= {"lead", "subagent:general-purpose"}
        journal = _api(console_server, f"{base}/journal?kind=model.call")
        assert page.locator("[data-testid=context-chart] rect[data-seq]").count() == len(journal)
        assert "TokenBudget" in str(page.get_by_test_id("manifest").text_content())
        assert page.get_by_test_id("interrupt").is_disabled()
        assert page.get_by_test_id("errors").locator("li").count() == 0
        assert page.problems == []
    finally:
        page.close()


def test_the_interrupt_button_stops_a_running_run(browser: Any, console_server: KeelServer, artefacts: Path) -> None:
    run = _start(console_server, ALICE, "alice", {"assistant_id": "echo", "input": {"steps": 200, "delay": 0.1, "custom": 1},
                                                   "stream_mode": ["updates", "custom"]})
    page = _open(browser, f"{console_server.url}/console#/runs/{run['thread_id']}/{run['run_id']}", ALICE)
    try:
        page.locator("[data-testid=live][data-state=live]").wait_for(timeout=TIMEOUT_MS)
        page.locator("[data-testid=live]", has_text="events").wait_for(timeout=TIMEOUT_MS)  # stream events arrive
        page.get_by_test_id("interrupt").click()
        page.locator("[data-testid=live][data-state=end]").wait_for(timeout=TIMEOUT_MS)
        page.locator("[data-testid=run-status]", has_text="interrupted").wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artefacts / "console-run-interrupted.png"), full_page=True)
        record = _api(console_server, f"/threads/{run['thread_id']}/runs/{run['run_id']}")
        assert record["status"] == "interrupted" and record["stop_reason"] == "cancelled"
        assert page.locator("[data-testid=stop-reasons] li[data-code=cancelled]").count() == 1
        assert page.problems == []
    finally:
        page.close()


def test_cancel_and_roll_back_asks_first_then_deletes_the_run(browser: Any, console_server: KeelServer, artefacts: Path) -> None:
    run = _start(console_server, ALICE, "alice", {"assistant_id": "echo", "input": {"steps": 200, "delay": 0.1, "custom": 1},
                                                   "stream_mode": ["custom"]})
    page = _open(browser, f"{console_server.url}/console#/runs/{run['thread_id']}/{run['run_id']}", ALICE)
    dialogs: list[str] = []
    try:
        page.locator("[data-testid=live]", has_text="events").wait_for(timeout=TIMEOUT_MS)
        page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.get_by_test_id("rollback").click()  # dismissed: nothing happens
        page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
        page.get_by_test_id("rollback").click()
        page.get_by_test_id("runs").wait_for(timeout=TIMEOUT_MS)  # back on the list
        assert len(dialogs) == 2 and "Roll back this run?" in dialogs[0]
        path = f"{console_server.url}/threads/{run['thread_id']}/runs/{run['run_id']}"
        deadline = time.monotonic() + 20
        while httpx.get(path, headers={"x-api-key": ALICE}).status_code != 404:
            assert time.monotonic() < deadline, "the rolled-back run was not deleted"
            time.sleep(0.1)
        page.locator(f"[data-testid=runs] tr[data-run-id='{run['run_id']}']").wait_for(state="detached", timeout=TIMEOUT_MS)
        assert page.problems == []
    finally:
        page.close()


def test_without_a_key_the_page_says_so_then_lists_with_one(browser: Any, console_server: KeelServer, artefacts: Path) -> None:
    theirs = _start(console_server, ROOT, "root", {"assistant_id": "echo", "input": {"steps": 1}})
    page = _open(browser, f"{console_server.url}/console", None)
    try:
        page.get_by_test_id("errors").locator("li", has_text="401").first.wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artefacts / "console-no-key.png"), full_page=True)
        page.get_by_label("API key").fill(ALICE)
        page.get_by_role("button", name="Use key").click()
        page.locator("[data-testid=runs] tbody tr").first.wait_for(timeout=TIMEOUT_MS)
        assert page.get_by_test_id("auth-state").text_content() == "key set for this tab"
        assert page.evaluate("sessionStorage.getItem('agentkeel.credential')") == ALICE
        shown = page.locator("[data-testid=runs] tbody tr").evaluate_all("rows => rows.map(r => r.dataset.runId)")
        assert theirs["run_id"] not in shown  # root's thread: not alice's to see
        page.get_by_label("status").select_option("interrupted")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_function("() => [...document.querySelectorAll('[data-testid=runs] tbody tr')].every(r => r.dataset.status === 'interrupted')",
                               timeout=TIMEOUT_MS)
        page.screenshot(path=str(artefacts / "console-runs.png"), full_page=True)
        assert page.get_by_test_id("errors").locator("li").count() == 0
        assert page.problems and all(RESOURCE_401 in problem for problem in page.problems)
    finally:
        page.close()
