"""One rule for a tool call's raw argument text: the scripted model and the guard agree on it.

The scripted model decides, as a provider client would, whether a scripted ``raw_args`` becomes a
tool call or an ``invalid_tool_call``; the ToolCallArguments guard decides whether a call with that
text may run. Both call ``tool_args``; this checks, over random text and cut or padded JSON, that
the two paths classify every input the same way and give the same reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage

from agentkeel.harness.middleware.tool_call_arguments import split_malformed
from agentkeel.harness.scripted import Script, ScriptedChatModel
from agentkeel.harness.tool_args import argument_error, parse_arguments

PLACEHOLDER = re.compile(r"\{(turn|agent|instance)\}")  # the scripted model renders these

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def _fragments(draw: st.DrawFn) -> str:
    """JSON text as a model might send it: whole, cut off, padded, or with a character flipped."""
    text = json.dumps(draw(_JSON), ensure_ascii=draw(st.booleans()))
    cut = draw(st.integers(min_value=0, max_value=len(text)))
    text = draw(st.sampled_from([text, text[:cut], text[cut:], f" \n{text}\t", text.replace('"', "'", 1)]))
    return text


def _scripted(raw: str) -> AIMessage:
    script = Script.model_validate({"agents": {"lead": [{"tool_calls": [{"name": "t", "id": "c", "raw_args": raw}]}]}})
    message = ScriptedChatModel(script=script).invoke([HumanMessage("go")])
    assert isinstance(message, AIMessage)
    return message


@settings(max_examples=300, deadline=None)
@given(raw=st.text(max_size=40) | _fragments())
@example(raw="")
@example(raw=" \n")
@example(raw="[1, 2]")
@example(raw='"text"')
@example(raw="NaN")
@example(raw='{"a": NaN}')
@example(raw='{"a": "line\nbreak"}')
@example(raw='{"a": "cut')
def test_the_scripted_model_and_the_guard_classify_raw_arguments_alike(raw: str) -> None:
    assume(not PLACEHOLDER.search(raw))
    error = argument_error(raw)
    message = _scripted(raw)
    _, malformed = split_malformed(message, {"c": raw})
    if error is None:
        assert [c["args"] for c in message.tool_calls] == [parse_arguments(raw)]
        assert message.invalid_tool_calls == [] and malformed == []
    else:
        assert message.tool_calls == []
        assert [(c["args"], c["error"]) for c in message.invalid_tool_calls] == [(raw, error)]
        assert [(m["args"], m["error"]) for m in malformed] == [(raw, error)]


def test_parse_arguments_gives_the_object_or_the_reason() -> None:
    parsed: dict[str, Any] | str = parse_arguments('{"a": [1]}')
    assert parsed == {"a": [1]}
    assert parse_arguments("  ") == {}
    assert parse_arguments("[1]") == "the arguments are a JSON list, not an object"
    assert parse_arguments("{") == "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
