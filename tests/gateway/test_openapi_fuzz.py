"""schemathesis over every route the gateway publishes in ``/openapi.json``, against a real
``keel serve`` process (scripted models, no network): no generated request may get a 5xx, and
every answer must be one the schema describes (status code, content type, body).

Its own server, not the shared one: the fuzzer creates threads, assistants and store items that
would change what the other tests count. Bounded so it fits the suite: a fixed seed, deterministic
generation, ``MAX_EXAMPLES`` per operation in the fuzzing phase (valid and invalid requests; the
examples phase adds the schema's own), a ``REQUEST_TIMEOUT_S`` per request and
``MAX_STREAM_EVENTS`` per event stream. Nothing is excluded: a stream (``/stream``, ``/threads/{id}/stream``, which follows
a thread until the client leaves) is read until that many events or that timeout, whichever comes
first, and counts as answered; ``/wait`` and ``/join`` return once their run ends (runs of the
scripted graphs end in well under the timeout).

Reproduce a failure, or fuzz longer, with the CLI against a running server (docs/security.md):
``schemathesis run http://127.0.0.1:2024/openapi.json -H 'x-api-key: ...' --checks not_a_server_error,...``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from server_support import KeelServer, start_server, write_project

from agentkeel.config import KeelConfig
from agentkeel.gateway.app import create_app

SEED = 20261201
MAX_EXAMPLES = 8
REQUEST_TIMEOUT_S = 10.0
MAX_STREAM_EVENTS = 50
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

# The schema is built in-process at collection time (schemathesis makes one test per operation
# from it, and its fixture-based loader does not run under this pytest); the first test proves
# it is the one the server publishes.
OPENAPI = create_app(KeelConfig()).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI, config=SchemathesisConfig.from_dict({
    "seed": SEED,
    "request-timeout": REQUEST_TIMEOUT_S,
    "max-stream-events": MAX_STREAM_EVENTS,
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "no-shrink": True, "mode": "all"},
    # The coverage phase (every parameter's boundary and invalid values: ~3000 requests, over a
    # minute more on 2 cores) is left to the CLI run in docs/security.md.
    "phases": {"examples": {"enabled": True}, "coverage": {"enabled": False}, "fuzzing": {"enabled": True}},
}))


# The server authenticates, and the fuzzer calls as a user without ``admin``: every request then
# also passes the ownership checks (gateway/access.py) with whatever ids it generated.
FUZZ_KEY = "fuzz-key-0123456789abcdef"
AUTH = {"mode": "api_keys", "api_keys": [{"user": "fuzzer", "key_env": "KEEL_KEY_FUZZ"}]}


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    config = write_project(tmp_path_factory.mktemp("keel-fuzz"), auth=AUTH)
    server = start_server(config, env_extra={"KEEL_KEY_FUZZ": FUZZ_KEY})
    yield server
    server.stop()


def test_the_fuzzed_schema_is_the_published_one(fuzzed_server: KeelServer) -> None:
    served = httpx.get(f"{fuzzed_server.url}/openapi.json", timeout=30)
    assert served.status_code == 200
    assert served.json() == OPENAPI
    search = f"{fuzzed_server.url}/threads/search"  # the fuzzer's key works; none is refused
    assert httpx.post(search, json={}, headers={"x-api-key": FUZZ_KEY}, timeout=30).status_code == 200
    assert httpx.post(search, json={}, timeout=30).status_code == 401


@schema.parametrize()
def test_every_published_route_answers_as_documented(case: Any, fuzzed_server: KeelServer) -> None:
    case.call_and_validate(base_url=fuzzed_server.url, checks=CHECKS, headers={"x-api-key": FUZZ_KEY})
