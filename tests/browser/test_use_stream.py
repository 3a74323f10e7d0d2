"""A chat page built on ``useStream`` (as LangChain's Agent Chat UI is), in headless Chromium,
served from another origin than ``keel serve``: a message streams to its answer, the thread is
listed by a thread search on ``graph_id``, and an interrupt is answered with ``command.resume``.
Every request crosses origins, so CORS, exposed headers and the SDK's request shapes are all
exercised by the browser itself, not by a test's idea of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from server_support import ASKER_SCRIPT, LEAD_NOTE, QUESTION_TEXT, KeelServer

TIMEOUT_MS = 20_000


def _open(browser: Any, page_url: str, api: KeelServer) -> Any:
    assert page_url.rsplit(":", 1)[1] != api.url.rsplit(":", 1)[1]  # two origins
    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", lambda request: _failed(problems, request))
    page.goto(f"{page_url}/index.html?{urlencode({'api': api.url, 'assistant': 'lead'})}")
    page.problems = problems
    return page


@pytest.fixture
def page(page_url: str, api_server: KeelServer, browser: Any) -> Iterator[Any]:
    page = _open(browser, page_url, api_server)
    yield page
    page.close()


def _failed(problems: list[str], request: Any) -> None:
    """A refused CORS request fails as ``net::ERR_FAILED``. ``ERR_ABORTED`` on a run stream is the
    SDK cancelling its reader once it has what it needs (it may race the server's close by a
    millisecond); the tests check separately that the run finished."""
    if not (request.failure == "net::ERR_ABORTED" and request.url.endswith("/stream")):
        problems.append(f"{request.method} {request.url}: {request.failure}")


def _send(page: Any, text: str, model: str = "") -> None:
    page.get_by_label("model").fill(model)
    page.get_by_label("message").fill(text)
    page.get_by_role("button", name="Send").click()


def _thread_id(page: Any) -> str:
    page.wait_for_function("document.querySelector('[data-testid=thread-id]').textContent.length > 0",
                           timeout=TIMEOUT_MS)
    return str(page.get_by_test_id("thread-id").text_content())


def _wait_idle(page: Any) -> None:
    page.wait_for_function("document.querySelector('[data-testid=status]').textContent === 'idle'",
                           timeout=TIMEOUT_MS)


def test_a_message_streams_to_its_answer_and_the_thread_is_listed(page: Any, api_server: KeelServer) -> None:
    _send(page, "write a note")
    answer = page.locator("[data-testid=messages] li[data-type=ai]").last
    answer.filter(has_text=f"Done: the note is at {LEAD_NOTE}.").wait_for(timeout=TIMEOUT_MS)
    _wait_idle(page)
    tid = _thread_id(page)
    texts = page.locator("[data-testid=messages] li").all_text_contents()
    assert texts[0] == "write a note" and texts[-1] == f"Done: the note is at {LEAD_NOTE}."
    # The answer grew chunk by chunk on screen (messages-tuple tokens), not in one final state.
    assert int(str(page.get_by_test_id("partials").text_content())) >= 2
    run = httpx.get(f"{api_server.url}/threads/{tid}/runs").json()[0]
    assert run["status"] == "success"

    page.get_by_role("button", name="Find threads").click()
    page.locator("[data-testid=threads] li", has_text=tid).wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_test_id("errors").locator("li").count() == 0
    assert page.problems == []


def test_an_interrupt_is_answered_and_the_run_finishes(page: Any, api_server: KeelServer) -> None:
    assert ASKER_SCRIPT["agents"]["lead"][0]["tool_calls"][0]["name"] == "ask_clarification"
    _send(page, "write a note", model="asker")
    page.get_by_test_id("interrupt").filter(has_text=QUESTION_TEXT).wait_for(timeout=TIMEOUT_MS)
    _wait_idle(page)
    tid = _thread_id(page)
    assert httpx.get(f"{api_server.url}/threads/{tid}").json()["status"] == "interrupted"

    page.get_by_label("model").fill("answered")
    page.get_by_label("answer").fill("boss")
    page.get_by_role("button", name="Resume").click()
    page.locator("[data-testid=messages] li[data-type=ai]").last.filter(has_text="Done.").wait_for(timeout=TIMEOUT_MS)
    _wait_idle(page)
    assert page.get_by_test_id("interrupt").count() == 0
    thread = httpx.get(f"{api_server.url}/threads/{tid}").json()
    assert thread["status"] == "idle" and thread["metadata"]["graph_id"] == "lead"
    runs = httpx.get(f"{api_server.url}/threads/{tid}/runs").json()
    assert [r["status"] for r in runs] == ["success", "success"]
    assert runs[0]["kwargs"]["command"] == {"resume": "boss"}
    assert page.get_by_test_id("errors").locator("li").count() == 0
    assert page.problems == []


def test_a_page_on_another_site_is_blocked_by_default(
    foreign_page_url: str, api_server: KeelServer, browser: Any
) -> None:
    """The control: the same page under a non-loopback name gets nowhere (the default allows
    loopback origins only), so the tests above pass because of the CORS answers."""
    page = _open(browser, foreign_page_url, api_server)
    try:
        assert page.evaluate("window.location.origin") == foreign_page_url
        _send(page, "write a note")
        page.get_by_test_id("errors").locator("li").first.wait_for(timeout=TIMEOUT_MS)
        assert any("POST" in problem and "net::ERR_FAILED" in problem for problem in page.problems)
        assert page.get_by_test_id("thread-id").text_content() == ""
    finally:
        page.close()
