"""The per-run request meter gives what estimating each request from scratch gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from agentkeel.harness.token_estimate import RequestMeter, messages_tokens

POOL: list[BaseMessage] = [SystemMessage("rules " * 9), HumanMessage("question " * 13)]
for i in range(30):
    POOL.append(AIMessage(f"step {i} " * (i % 7 + 1), tool_calls=[{"name": "ls", "args": {"path": "/w" * i}, "id": f"c{i}"}]))
    POOL.append(ToolMessage("f1\nf2 " * (i % 5 + 1), tool_call_id=f"c{i}"))

edits = st.lists(st.tuples(st.sampled_from(["grow", "copy_one", "drop", "shrink", "fresh"]), st.integers(0, 60)), max_size=30)


@settings(max_examples=80, deadline=None)
@given(edits)
def test_any_sequence_of_requests_is_estimated_as_from_scratch(steps: list[tuple[str, int]]) -> None:
    meter = RequestMeter()
    request = list(POOL[:4])
    for op, n in steps:
        if op == "grow":
            request = [*request, *POOL[len(request) % len(POOL):][: n % 3 + 1]]
        elif op == "copy_one" and request:  # a middleware's copy of one message, as a new object
            i = n % len(request)
            request = [*request[:i], request[i].model_copy(update={"content": f"changed {n}"}), *request[i + 1:]]
        elif op == "drop" and request:
            i = n % len(request)
            request = request[:i] + request[i + 1:]
        elif op == "shrink":
            request = request[: n % (len(request) + 1)]
        elif op == "fresh":
            request = [m.model_copy() for m in request]
        assert meter.tokens(request) == messages_tokens(request), (op, n)
