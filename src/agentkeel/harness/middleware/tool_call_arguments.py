"""ToolCallArguments: a tool call whose arguments are not valid JSON is never executed.

Two ways a malformed call reaches the agent loop, both silent before this guard:

* The provider client could not parse the arguments and reports an ``invalid_tool_call``. LangChain
  never runs those, but a response with *only* invalid calls has no tool calls, so the loop took it
  as the final answer: the run ended "clean" with an empty answer and the model never heard why.
* The response was **streamed**: LangChain aggregates the argument fragments with its partial-JSON
  parser, which *repairs* a truncated string (it closes the open string and object). A call cut
  off mid-``content`` arrives as a valid call with half its content, and ran.

The raw argument text survives differently per provider. A non-streamed OpenAI-style reply keeps
it only for invalid calls (``invalid_tool_calls[i]["args"]``; the valid ones were parsed with
``json.loads``). A streamed Anthropic reply keeps it in the ``tool_use`` content block
(``partial_json``). A streamed OpenAI-style reply keeps it nowhere: the final message is rebuilt
from the chunks and drops ``tool_call_chunks``. So while the model call runs, this guard listens
to the streamed chunks (a callback added to the call's config) and keeps each call's argument text.

Every call whose text does not parse as a JSON object (``tool_args.argument_error``, the one rule
the scripted model applies too), and every invalid call, is answered in the same model step with
an error ToolMessage that quotes the parse error (``Expecting ',' delimiter: line 1 column 40
(char 39)``) and is never dispatched. The call stays in the message as a call with ``{}`` as
arguments — so the provider sees a well-formed call followed by its result, and the agent loop, finding every call answered, goes back to the model instead of
ending: a response with only malformed calls is never the final answer. What the model actually
sent (raw text and error per call) is kept under ``additional_kwargs["agentkeel_malformed"]``.

A guard outer of this one that withholds or suppresses such a call also drops its result
(:func:`~agentkeel.harness.middleware.responses.replace_ai`), so the response stays well-paired.
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AIMessageChunk, ToolCall, ToolMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import TOOL_META, fingerprint
from agentkeel.harness.middleware.listen import TokenListener, listening
from agentkeel.harness.middleware.responses import last_ai
from agentkeel.harness.tool_args import argument_error

MALFORMED = "agentkeel_malformed"
_TAIL_CHARS = 80


def malformed_result(call_id: str, name: str, raw: str | None, error: str, by: str) -> ToolMessage:
    """The error ToolMessage that answers a call whose arguments could not be parsed."""
    tool = name or "an unnamed tool"
    if raw:
        tail = raw[-_TAIL_CHARS:]
        seen = f" The argument text had {len(raw)} characters and ended with: {'…' if len(raw) > len(tail) else ''}{tail}"
    else:
        seen = ""
    content = (
        f"Error: the arguments of this call to {tool} were not valid JSON ({error}), so the call was "
        f"not executed.{seen} Send the call again with complete, valid JSON arguments; if they are "
        "long (a big file), split the work into several smaller calls."
    )
    meta = {"status": "error", "fingerprint": fingerprint(content), "source": by, "error_type": "malformed_arguments"}
    return ToolMessage(
        content=content, name=name or None, tool_call_id=call_id, status="error",
        additional_kwargs={TOOL_META: meta},
    )


class StreamedArguments(TokenListener):
    """Collects the argument text of every streamed tool call, by call id.

    LangChain reports each chunk twice on some paths (the provider and the base model both call
    ``on_llm_new_token`` with the same object), so chunks are counted once by identity.
    """

    def __init__(self) -> None:
        self._seen: dict[int, Any] = {}  # id() -> chunk, kept alive so ids are never reused
        self._calls: dict[tuple[UUID, int | str], dict[str, Any]] = {}

    def on_llm_new_token(self, token: Any, *, chunk: Any = None, run_id: UUID, **kwargs: Any) -> None:
        message = getattr(chunk, "message", None)
        if not isinstance(message, AIMessageChunk) or not message.tool_call_chunks or id(chunk) in self._seen:
            return
        self._seen[id(chunk)] = chunk
        for position, part in enumerate(message.tool_call_chunks):
            index = part.get("index")
            key = (run_id, index if index is not None else f"unindexed-{len(self._calls)}-{position}")
            entry = self._calls.setdefault(key, {"id": None, "args": ""})
            if part.get("id"):
                entry["id"] = part["id"]
            entry["args"] += part.get("args") or ""

    def raw_args(self) -> dict[str, str]:
        return {str(entry["id"]): entry["args"] for entry in self._calls.values() if entry["id"]}


def content_raw_args(message: AIMessage) -> dict[str, str]:
    """Raw argument text kept in content blocks (a streamed Anthropic ``tool_use`` block)."""
    if not isinstance(message.content, list):
        return {}
    return {
        str(block["id"]): str(block["partial_json"])
        for block in message.content
        if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id")
        and isinstance(block.get("partial_json"), str) and not block.get("input")
    }


def split_malformed(message: AIMessage, raw: dict[str, str]) -> tuple[AIMessage, list[dict[str, Any]]]:
    """``message`` with every malformed call (invalid, or whose raw text does not parse) turned into
    a call with ``{}`` as arguments, and what the model sent for each (``id``, ``name``, ``args``
    — the raw text — and ``error``). ``message`` itself when every call is well-formed."""
    calls: list[ToolCall] = []
    malformed: list[dict[str, Any]] = []
    for call in message.tool_calls:
        text = raw.get(str(call.get("id")))
        error = argument_error(text) if text is not None else None
        if error is None:
            calls.append(call)
            continue
        calls.append({**call, "args": {}})
        malformed.append({"id": call.get("id"), "name": call["name"], "args": text, "error": error})
    for invalid in message.invalid_tool_calls:
        if not invalid.get("id"):
            continue  # nothing can answer it, and no converter sends it without an id
        text = invalid.get("args")
        error = argument_error(text) or str(invalid.get("error") or "the arguments could not be parsed")
        calls.append(ToolCall(name=invalid.get("name") or "", args={}, id=invalid["id"], type="tool_call"))
        malformed.append({"id": invalid["id"], "name": invalid.get("name") or "", "args": text, "error": error})
    if not malformed:
        return message, []
    kwargs = {**message.additional_kwargs, MALFORMED: malformed}
    return message.model_copy(update={
        "tool_calls": calls, "invalid_tool_calls": [], "additional_kwargs": kwargs,
    }), malformed


class ToolCallArguments(KeelMiddleware):
    """Never executes a tool call with malformed arguments; tells the model and lets it retry."""

    contract: ClassVar[Contract] = Contract(
        axes={"model": on(reads={"model_response.tool_calls"}, mutates={"model_response.tool_calls"})},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        streamed = StreamedArguments()
        with listening(streamed):
            response = await handler(request)
        ai = last_ai(response)
        if ai is None or not (ai.tool_calls or ai.invalid_tool_calls):
            return response
        checked, malformed = split_malformed(ai, {**content_raw_args(ai), **streamed.raw_args()})
        if not malformed:
            return response
        self.intervene(
            request.runtime, "malformed_arguments",
            f"{len(malformed)} tool call(s) with malformed arguments were not executed: "
            + ", ".join(str(m["name"]) for m in malformed),
            calls=[{k: m[k] for k in ("name", "id", "error")} for m in malformed],
        )
        results = [malformed_result(str(m["id"]), m["name"], m["args"], m["error"], self.name) for m in malformed]
        at = next(i for i, m in enumerate(response.result) if m is ai)
        result = [*response.result[:at], checked, *results, *response.result[at + 1 :]]
        return ModelResponse(result=result, structured_response=response.structured_response)


__all__ = [
    "StreamedArguments",
    "MALFORMED",
    "ToolCallArguments",
    "argument_error",
    "content_raw_args",
    "malformed_result",
    "split_malformed",
]
