"""Helpers of the authentication tests: a gateway app over its own runtime with ``auth:`` set, a
graph that reports the run's trusted ``RunContext.user``, and a JWKS endpoint on a free port."""

from __future__ import annotations

import contextlib
import json
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from agentkeel.config import KeelConfig
from agentkeel.gateway.app import create_app
from agentkeel.runtime.runtime import Runtime, open_runtime

WHO_GRAPH = textwrap.dedent(
    '''
    """``who`` answers with the user the runtime installed in the run's trusted context."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime


    class State(TypedDict, total=False):
        who: str | None


    def answer(state: State, runtime: Runtime) -> State:
        return {"who": getattr(runtime.context, "user", "no context")}


    _who = StateGraph(State)
    _who.add_node("answer", answer)
    _who.add_edge(START, "answer")
    _who.add_edge("answer", END)
    who = _who.compile()
    '''
)

LOCAL_ORIGIN = "http://localhost:3000"


def auth_config(tmp_path: Path, auth: dict[str, Any]) -> KeelConfig:
    (tmp_path / "who.py").write_text(WHO_GRAPH)
    return KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://", graphs={"who": "./who.py:who"}, auth=auth,
        base_dir=tmp_path,
    )


@contextlib.asynccontextmanager
async def auth_client(tmp_path: Path, auth: dict[str, Any]) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    """The gateway in-process over a fresh runtime (the environment must already hold the secrets)."""
    async with open_runtime(auth_config(tmp_path, auth)) as runtime:
        transport = httpx.ASGITransport(app=create_app(runtime), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=20) as http:
            yield runtime, http


async def whoami(http: httpx.AsyncClient, headers: dict[str, str], **body: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``who`` on a new thread and wait: (what the graph saw as the user, the run resource)."""
    created = await http.post("/threads", json={}, headers=headers)
    assert created.status_code == 200, created.text
    tid = created.json()["thread_id"]
    waited = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "who", "input": {}, **body}, headers=headers)
    assert waited.status_code == 200, waited.text
    runs = await http.get(f"/threads/{tid}/runs", headers=headers)
    assert runs.status_code == 200, runs.text
    return waited.json().get("who"), runs.json()[0]


def refused(response: httpx.Response, status: int = 401, *, challenge: bool = True) -> str:
    """The refusal's ``detail``, after checking it is JSON with the status (and the challenge)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"detail"} and isinstance(body["detail"], str) and body["detail"]
    if challenge:
        assert response.headers["www-authenticate"].startswith("Bearer")
    return str(body["detail"])


class Jwks:
    """A JWKS endpoint on 127.0.0.1 (a thread of this process) whose keys a test can rotate."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.requests = 0
        self.failing = False
        self.delay_s = 0.0  # how long each answer takes
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                jwks.requests += 1
                time.sleep(jwks.delay_s)
                if jwks.failing:
                    self.send_error(500)
                    return
                body = json.dumps({"keys": jwks.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"

    @contextlib.contextmanager
    def serving(self) -> Iterator[Jwks]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(5)
