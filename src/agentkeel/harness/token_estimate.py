"""The token estimate used wherever a provider reports no usage: four characters per token.

Budgets must bind on every path, also when a provider (or an OpenAI-compatible server) sends no
usage for a call. The estimate is deliberately simple and dependency-free — characters of the
message text plus the JSON of its tool-call arguments, divided by four, rounded up — which is the
usual rule of thumb for English text and code with BPE tokenizers. It is marked ``estimated`` where
it is recorded, so nobody mistakes it for a provider's count.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage


def approx_tokens(chars: int) -> int:
    """The four-characters-per-token estimate, never below one token."""
    return max(1, math.ceil(chars / 4))


def message_chars(message: BaseMessage) -> int:
    """Characters a message puts on the wire: its text and its tool calls' JSON arguments."""
    chars = len(message.text)
    if isinstance(message, AIMessage):
        chars += sum(len(_json(call.get("args"))) + len(call.get("name") or "") for call in message.tool_calls)
    return chars


def messages_tokens(messages: Iterable[BaseMessage]) -> int:
    """The estimated tokens of a request's messages."""
    return approx_tokens(sum(message_chars(m) for m in messages))


class RequestMeter:
    """``messages_tokens`` for the successive requests of one run, counting each message once.

    Why: every model call of a run re-sends the whole history, so estimating each request from
    scratch is quadratic in the run's length (at 400 messages it was most of what journaling a
    model call cost). A message object, once in the state, is not changed in place (LangGraph's
    reducers replace messages, never edit them), so its count is remembered by identity; the
    object is held beside its count so the id cannot be reused while remembered. The meter lives
    as long as the run's journal handler, so what it holds is at most what the run's history held.
    """

    def __init__(self) -> None:
        self._chars: dict[int, tuple[BaseMessage, int]] = {}
        self._last: list[BaseMessage] = []  # the previous request's messages ...
        self._last_counts: list[int] = []  # ... and their counts, position by position

    def tokens(self, messages: Iterable[BaseMessage]) -> int:
        # Position by position against the previous request, in C (``map``, ``list.index``,
        # ``sum``): the next request is the same objects plus a few, and even a dictionary
        # look-up per message per call added up over a long run. Only the positions that differ
        # and the new tail are looked up.
        current = list(messages)
        same = list(map(operator.is_, self._last, current))
        counts = self._last_counts[: len(same)]
        at = 0
        while True:
            try:
                at = same.index(False, at)
            except ValueError:
                break
            counts[at] = self._count(current[at])
            at += 1
        counts.extend(self._count(message) for message in current[len(same):])
        self._last, self._last_counts = current, counts
        return approx_tokens(sum(counts))

    def _count(self, message: BaseMessage) -> int:
        hit = self._chars.get(id(message))
        if hit is None or hit[0] is not message:
            hit = self._chars[id(message)] = (message, message_chars(message))
        return hit[1]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


__all__ = ["RequestMeter", "approx_tokens", "message_chars", "messages_tokens"]
