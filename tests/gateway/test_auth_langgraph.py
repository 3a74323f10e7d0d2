"""``auth.mode: langgraph``: a ``langgraph_sdk.Auth`` file's ``@auth.authenticate`` handler decides,
called with the parameters it names; its ``HTTPException`` is the answer (status, detail, headers),
an ``AssertionError`` a 401, a handler bug a logged JSON 500 — and its identity reaches the run."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from test_auth_support import LOCAL_ORIGIN, auth_client, refused, whoami

from agentkeel.gateway.auth_langgraph import LangGraphAuth

AUTH_PY = textwrap.dedent(
    '''
    from langgraph_sdk import Auth

    auth = Auth()
    SEEN = []


    @auth.authenticate
    async def authenticate(headers: dict, authorization: str | None, path: str, method: str, query_params: dict) -> Auth.types.MinimalUserDict:
        SEEN.append((method, path, dict(query_params)))
        token = headers.get("x-token")  # a str key, as in the LangGraph docs
        assert headers.get(b"x-token") == token  # and the bytes keys the server passes
        if token is None:
            raise Auth.exceptions.HTTPException(status_code=401, detail="no x-token", headers={"WWW-Authenticate": "Token"})
        if token == b"blocked":
            raise Auth.exceptions.HTTPException(status_code=403, detail="this token is blocked")
        if token == b"assert":
            assert False, "asserted away"
        if token == b"broken":
            return None
        if token == b"anonymous":
            return {"identity": "anon", "is_authenticated": False}
        if token == b"plain":
            return "plain-user"
        return {"identity": token.decode(), "display_name": "Frank", "permissions": ["admin"], "org": "acme",
                "seen_authorization": authorization}
    '''
)

CONFIG = {"mode": "langgraph", "path": "./auth.py:auth"}


async def test_the_handler_decides_and_its_identity_reaches_the_run(tmp_path: Path) -> None:
    (tmp_path / "auth.py").write_text(AUTH_PY)
    async with auth_client(tmp_path, CONFIG) as (_runtime, http):
        assert (await http.get("/ok")).status_code == 200
        seen, run = await whoami(http, {"x-token": "frank"})
        assert seen == "frank" and run["kwargs"]["user"] == "frank"
        assert (await whoami(http, {"x-token": "plain"}))[0] == "plain-user"

        missing = await http.post("/threads/search?limit=3", json={})
        assert refused(missing, challenge=False) == "no x-token" and missing.headers["www-authenticate"] == "Token"
        assert refused(await http.post("/threads/search", json={}, headers={"x-token": "blocked"}), 403,
                       challenge=False) == "this token is blocked"
        assert refused(await http.post("/threads/search", json={}, headers={"x-token": "assert"})) == "asserted away"
        assert refused(await http.post("/threads/search", json={}, headers={"x-token": "anonymous"})) == "Unauthorized"
        broken = await http.post("/threads/search", json={}, headers={"x-token": "broken"})
        assert broken.status_code == 500 and broken.json() == {"detail": "authentication failed: internal error"}

        preflight = await http.options("/threads", headers={"Origin": LOCAL_ORIGIN, "Access-Control-Request-Method": "POST",
                                                            "Access-Control-Request-Headers": "x-token"})
        assert preflight.status_code == 200  # answered by CORS: the handler never saw it

        seen_calls = sys.modules["agentkeel_user_auth_path"].SEEN
        assert ("POST", "/threads/search", {"limit": "3"}) in seen_calls
        assert not any(method == "OPTIONS" for method, _, _ in seen_calls)


async def test_a_sync_handler_runs_in_a_thread_with_the_request(tmp_path: Path) -> None:
    (tmp_path / "sync_auth.py").write_text(textwrap.dedent(
        '''
        import threading
        from langgraph_sdk import Auth

        auth = Auth()
        MAIN = threading.main_thread()


        @auth.authenticate
        def authenticate(request):
            assert threading.current_thread() is not MAIN, "ran on the event loop's thread"
            return {"identity": request.headers.get("x-user", "nobody"), "permissions": ("read",)}
        '''
    ))
    handler = LangGraphAuth.load("./sync_auth.py:auth", tmp_path)
    scope = {"type": "http", "method": "GET", "path": "/threads", "query_string": b"", "headers": [(b"x-user", b"gina")]}
    identity = await handler(scope)
    assert identity.user_id == "gina" and identity.permissions == ("read",) and not identity.is_admin
