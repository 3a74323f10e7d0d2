"""Reading and rewriting model responses (and tool results) the way every guard must: one
implementation.

Two ways to take tool calls away from a response, kept apart on purpose:

* **suppress** — a protocol repair (provider safety stop, output cut at the length limit, siblings
  of a clarification question): the calls are not the model's real intent, so no guard counts them.
  They are kept under ``additional_kwargs["agentkeel_suppressed"]`` for the transcript.
* **withhold** — a guard decision (loop, budget, turn limit): the calls *were* the model's intent,
  so other guards still count them (:func:`intended_calls`), which makes every guard's decision
  independent of which guard ran first. Kept under ``additional_kwargs["agentkeel_withheld"]``.

Both keep the message id (the message replaces itself in state), drop the raw provider tool-call
fields and the content blocks of the calls taken (an Anthropic ``tool_use`` block is sent as a call
even when ``tool_calls`` no longer has it: a call without a result, which a strict provider
rejects), turn ``finish_reason: tool_calls`` into ``stop`` and append a short bracketed note to the
text so the model and the reader see what happened. Both can take only some calls (``keep``); the
kept ones stay live and the response still ends in tool calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents.middleware.types import ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langgraph.types import Command

WITHHELD = "agentkeel_withheld"
SUPPRESSED = "agentkeel_suppressed"
HINT = "agentkeel_hint"
_RAW_CALL_FIELDS = ("tool_calls", "function_call")


def last_ai(response: ModelResponse) -> AIMessage | None:
    for message in reversed(response.result):
        if isinstance(message, AIMessage):
            return message
    return None


def replace_ai(response: ModelResponse, old: AIMessage, new: AIMessage) -> ModelResponse:
    """``response`` with ``old`` replaced by ``new``. Results the response carries for calls ``new``
    no longer makes (a guard withheld an already answered call) go too: a response never holds a
    tool result without its call."""
    kept = {c.get("id") for c in new.tool_calls}
    gone = {c.get("id") for c in old.tool_calls} - kept
    result = [
        new if m is old else m
        for m in response.result
        if not (isinstance(m, ToolMessage) and m.tool_call_id in gone)
    ]
    return ModelResponse(result=result, structured_response=response.structured_response)


def text_of(message: BaseMessage) -> str:
    """The visible text of a message (string content, or its text blocks)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in ("text", "output_text"):
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def with_note(content: Any, note: str) -> Any:
    """``content`` with ``note`` appended, preserving list content."""
    if isinstance(content, list):
        return [*content, {"type": "text", "text": f"\n\n{note}"}]
    text = content if isinstance(content, str) else ("" if content is None else str(content))
    return f"{text}\n\n{note}" if text else note


_CALL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call"})


def _without_call_blocks(content: Any, gone: set[Any]) -> Any:
    """``content`` without the content blocks that carry one of the ``gone`` calls."""
    if not isinstance(content, list) or not gone:
        return content
    return [
        block for block in content
        if not (isinstance(block, dict) and block.get("type") in _CALL_BLOCKS
                and (block.get("id") in gone or block.get("call_id") in gone))
    ]


def _stash(message: AIMessage, key: str, by: str, reason: str, keep: Sequence[ToolCall]) -> AIMessage:
    keep_ids = {c.get("id") for c in keep}
    taken = [c for c in message.tool_calls if c.get("id") not in keep_ids]
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k not in _RAW_CALL_FIELDS}
    stash = dict(kwargs.get(key) or {"by": [], "tool_calls": []})
    stash["by"] = [*stash.get("by", []), {"middleware": by, "reason": reason}]
    stash["tool_calls"] = [*stash.get("tool_calls", []), *[dict(c) for c in taken]]
    kwargs[key] = stash
    metadata = dict(message.response_metadata)
    if not keep and metadata.get("finish_reason") in ("tool_calls", "function_call"):
        metadata["finish_reason"] = "stop"
    content = _without_call_blocks(message.content, {c.get("id") for c in taken} - {None})
    return message.model_copy(update={
        "tool_calls": list(keep), "invalid_tool_calls": [], "tool_call_chunks": [],
        "additional_kwargs": kwargs, "response_metadata": metadata,
        "content": with_note(content, reason),
    })


def withhold(message: AIMessage, by: str, reason: str, keep: Sequence[ToolCall] = ()) -> AIMessage:
    """A guard's strip of every call except ``keep``: the calls stay counted as intent (see
    module docstring)."""
    return _stash(message, WITHHELD, by, reason, keep)


def suppress(message: AIMessage, by: str, reason: str, keep: Sequence[ToolCall] = ()) -> AIMessage:
    """A protocol repair: the calls (except ``keep``) are not intent and are never counted."""
    return _stash(message, SUPPRESSED, by, reason, keep)


def intended_calls(message: AIMessage) -> list[ToolCall]:
    """The tool calls the model asked for after protocol repairs: live plus guard-withheld."""
    withheld = (message.additional_kwargs.get(WITHHELD) or {}).get("tool_calls") or []
    return [*message.tool_calls, *withheld]


def was_stripped(message: AIMessage) -> bool:
    """Whether a guard or a repair took tool calls away from this response."""
    return bool(message.additional_kwargs.get(WITHHELD) or message.additional_kwargs.get(SUPPRESSED))


def map_tool_messages(result: Any, fn: Callable[[ToolMessage], ToolMessage]) -> Any:
    """``result`` with ``fn`` applied to its ToolMessage, or to each ToolMessage in a Command's
    ``update["messages"]``; anything else is returned as is."""
    if isinstance(result, ToolMessage):
        return fn(result)
    if isinstance(result, Command) and isinstance(result.update, dict):
        messages = result.update.get("messages")
        if isinstance(messages, list) and any(isinstance(m, ToolMessage) for m in messages):
            patched = [fn(m) if isinstance(m, ToolMessage) else m for m in messages]
            return dataclasses.replace(result, update={**result.update, "messages": patched})
    return result


def hint_message(name: str, texts: Sequence[str]) -> HumanMessage:
    """A transient framework note appended to one request (never written to state)."""
    return HumanMessage(content="\n\n".join(texts), name=name, additional_kwargs={HINT: True})


def is_hint(message: BaseMessage) -> bool:
    return isinstance(message, HumanMessage) and bool(message.additional_kwargs.get(HINT))


__all__ = [
    "HINT",
    "SUPPRESSED",
    "WITHHELD",
    "hint_message",
    "intended_calls",
    "is_hint",
    "last_ai",
    "map_tool_messages",
    "replace_ai",
    "suppress",
    "text_of",
    "was_stripped",
    "with_note",
    "withhold",
]
