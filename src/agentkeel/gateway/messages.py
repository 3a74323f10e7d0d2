"""The ``messages`` stream mode: per-token chunks turned into accumulated-message frames.

The worker publishes LangGraph's ``messages`` events as ``[chunk, metadata]`` pairs (the chunk is
``model_dump()`` of an ``AIMessageChunk``). Clients that ask for ``stream_mode="messages"`` expect
what the official server sends instead: ``messages/metadata`` ``{id: {"metadata": ...}}`` the first
time a message id appears, then ``messages/partial`` ``[message so far]`` after every chunk, and
``messages/complete`` ``[message]`` for a message that was never streamed in chunks. Namespaced
events keep their suffix (``messages|a|b`` gives ``messages/partial|a|b``).

The cost of this format is quadratic: each partial frame re-sends the whole message, so a reply of
n characters streamed in chunks of c characters makes the client parse about n²/2c characters.
Text is still sent after every chunk, because it is what a reader watches and must never lag;
a client that cares about parse work should ask for ``messages-tuple``, whose frames carry only the
delta. Large file-tool arguments, where the cost really bites, are batched upstream of this module
(``toolargs.ToolArgBatcher``) so their frames stay few and the total stays linear.

Accumulation follows LangChain's chunk addition (the chunks are rebuilt as LangChain objects and
added), with one exception: tool-call argument text is kept aside in :class:`PartialJson`. Adding
chunks re-parses every accumulated argument with ``parse_partial_json``, a Python loop over the
whole text, so a megabyte ``write_file`` argument would cost a second of event-loop time per frame.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import BaseMessageChunk, message_chunk_to_message, messages_from_dict

Frame = tuple[str, Any]
"""One SSE frame before encoding: ``(event name, JSON-able data)``."""

MESSAGES = "messages"
CHUNK_TYPES = frozenset(
    {
        "AIMessageChunk",
        "HumanMessageChunk",
        "SystemMessageChunk",
        "ToolMessageChunk",
        "FunctionMessageChunk",
        "ChatMessageChunk",
    }
)
"""The streamed (chunk) message types LangChain can rebuild; any other type is a complete message."""

_IN_STRING = re.compile(r'["\\]')
_OUTSIDE_STRING = re.compile(r'["{}\[\]]')
_CLOSER = {"{": "}", "[": "]"}


class PartialJson:
    """JSON text that arrives in fragments, parsed as LangChain parses streamed tool arguments.

    The scanner state of ``langchain_core.utils.json.parse_partial_json`` (inside a string?
    after a backslash? which brackets are open?) is advanced once per fragment, jumping between
    the only characters that change it with a regex; :meth:`value` then needs just C-speed
    ``json.loads`` calls. The result equals ``parse_partial_json(text)``, except that where that
    raises this returns ``None`` - either way the text is no tool-call ``dict`` (a property test
    compares the two).
    """

    __slots__ = ("_broken", "_done", "_escaped", "_in_string", "_parts", "_stack")

    def __init__(self, text: str = "") -> None:
        self._done = ""
        self._parts: list[str] = []
        self._in_string = False
        self._escaped = False
        self._stack: list[str] = []
        self._broken = False
        self.append(text)

    def append(self, fragment: str) -> None:
        if fragment:
            self._parts.append(fragment)
            if not self._broken:
                self._scan(fragment)

    @property
    def text(self) -> str:
        """The whole text; joined lazily so appending a fragment never copies what came before."""
        if self._parts:
            self._done = "".join([self._done, *self._parts])
            self._parts.clear()
        return self._done

    def _scan(self, fragment: str) -> None:
        pos, end = 0, len(fragment)
        while pos < end:
            if self._in_string:
                match = _IN_STRING.search(fragment, pos)
                if match is None or match.start() > pos:
                    self._escaped = False  # any other character ends an escape
                if match is None:
                    return
                if match.group() == "\\":
                    self._escaped = not self._escaped
                elif self._escaped:
                    self._escaped = False
                else:
                    self._in_string = False
            else:
                match = _OUTSIDE_STRING.search(fragment, pos)
                if match is None:
                    return
                char = match.group()
                if char == '"':
                    self._in_string, self._escaped = True, False
                elif char in _CLOSER:
                    self._stack.append(_CLOSER[char])
                elif self._stack and self._stack[-1] == char:
                    self._stack.pop()
                else:
                    self._broken = True  # a closer that matches nothing: LangChain gives up for good
                    return
            pos = match.end()

    def value(self) -> Any:
        """The parsed value: complete JSON as is, an open prefix closed and trimmed like LangChain."""
        text = self.text
        if self._broken:
            return None
        if not self._in_string and not self._stack:
            try:
                return json.loads(text, strict=False)
            except json.JSONDecodeError:
                pass
        body = text
        if self._in_string:
            body = (body[:-1] if self._escaped else body) + '"'
        closers = "".join(reversed(self._stack))
        while body:
            try:
                return json.loads(body + closers, strict=False)
            except json.JSONDecodeError as exc:
                # Cut at the rejected character, or drop the last one when the closers were rejected.
                body = body[: exc.pos] if exc.pos < len(body) else body[:-1]
        return None


def tool_calls_of(calls: Iterable[tuple[str | None, PartialJson, str | None]]) -> tuple[list[Any], list[Any]]:
    """``(tool_calls, invalid_tool_calls)`` for ``(name, args, id)`` triples, as LangChain derives them."""
    valid: list[Any] = []
    invalid: list[Any] = []
    for name, args, call_id in calls:
        parsed = args.value() if args.text else {}
        if isinstance(parsed, dict):
            valid.append({"name": name or "", "args": parsed, "id": call_id, "type": "tool_call"})
        else:
            invalid.append({"name": name, "args": args.text, "id": call_id, "error": None, "type": "invalid_tool_call"})
    return valid, invalid


def message_pair(data: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(message, metadata)`` of a ``messages`` event's data, or ``None`` when it is no such pair."""
    if isinstance(data, (list, tuple)) and len(data) == 2 and isinstance(data[0], dict):
        return data[0], data[1] if isinstance(data[1], dict) else {}
    return None


def _merges_by_index(index: Any) -> bool:
    """Whether LangChain's ``merge_lists`` merges list elements carrying this ``index``."""
    return isinstance(index, int) or (isinstance(index, str) and index.startswith("lc_"))


class _Message:
    """One message id's chunks added up, the tool-call argument text held in :class:`PartialJson`.

    Chunks enter LangChain's addition with their ``tool_call_chunks`` args blanked, so LangChain
    still merges names, ids and indices (and everything else) by its own rules while parsing
    nothing; ``_args[i]`` holds the text of ``tool_call_chunks[i]`` of the sum.
    """

    def __init__(self) -> None:
        self._sum: BaseMessageChunk | None = None
        self._args: list[PartialJson] = []

    def add(self, chunk: dict[str, Any]) -> None:
        fields = dict(chunk)
        part = None
        incoming = fields.get("tool_call_chunks")
        if not incoming:  # not a dump of a chunk: LangChain may still derive them (from tool_calls)
            part = _chunk(fields)
            incoming = getattr(part, "tool_call_chunks", None)
        if incoming:
            for position, piece in zip(self._positions(incoming), incoming, strict=True):
                if position == len(self._args):
                    self._args.append(PartialJson())
                self._args[position].append(piece.get("args") or "")
            fields.update(
                tool_call_chunks=[{**piece, "args": ""} for piece in incoming], tool_calls=[], invalid_tool_calls=[]
            )
            part = _chunk(fields)
        assert part is not None
        self._sum = part if self._sum is None else self._sum + part

    def _positions(self, incoming: list[dict[str, Any]]) -> list[int]:
        """Where each incoming tool-call chunk lands in the sum, by ``merge_lists``' matching rule."""
        if self._sum is None:  # the first chunk's list is taken as is, never merged within itself
            return list(range(len(incoming)))
        merged = [(c.get("index"), c.get("id")) for c in getattr(self._sum, "tool_call_chunks", [])]
        positions = []
        for piece in incoming:
            index, call_id = piece.get("index"), piece.get("id")
            position = next(
                (
                    at
                    for at, (left_index, left_id) in enumerate(merged)
                    if _merges_by_index(index)
                    and left_index == index
                    and (left_id in (None, "") or call_id in (None, "") or left_id == call_id)
                ),
                None,
            )
            if position is None:
                merged.append((index, call_id))
                position = len(merged) - 1
            elif call_id not in (None, ""):
                merged[position] = (index, call_id)
            positions.append(position)
        return positions

    def render(self) -> dict[str, Any]:
        """The message so far, in its non-chunk form (``type: "ai"``), as the official server sends it."""
        assert self._sum is not None
        message = message_chunk_to_message(self._sum).model_dump()
        if self._args:
            calls = getattr(self._sum, "tool_call_chunks", [])
            valid, invalid = tool_calls_of(
                (call.get("name"), args, call.get("id")) for call, args in zip(calls, self._args, strict=True)
            )
            message["tool_calls"], message["invalid_tool_calls"] = valid, invalid
            # On the last chunk of v1 output LangChain turns content tool-call blocks into tool
            # calls; the sum did that with the blanked args, so give those blocks the real ones.
            by_id = {call["id"]: call["args"] for call in valid}
            for block in message["content"] if isinstance(message["content"], list) else ():
                if isinstance(block, dict) and block.get("type") == "tool_call" and block.get("id") in by_id:
                    block["args"] = by_id[block["id"]]
        return message


class MessagesModeTransformer:
    """Bridge ``messages`` events in, ``messages/metadata|partial|complete`` frames out; one per response.

    Memory is bounded twice: a message is forgotten after its ``chunk_position == "last"`` chunk
    (which LangChain's streaming always ends with), and at most ``max_messages`` are remembered
    (least recently fed evicted) for producers that never mark the end. A finish reason in
    ``response_metadata`` is not an end marker: OpenAI sends a usage-only chunk after it, and
    forgetting before that would restart the message from that chunk alone.
    """

    def __init__(self, max_messages: int = 256) -> None:
        self._max = max_messages
        self._messages: OrderedDict[tuple[str, str], _Message] = OrderedDict()

    def feed(self, event: str, data: Any) -> list[Frame]:
        """Frames for one ``messages`` / ``messages|ns...`` event; malformed data yields none."""
        pair = message_pair(data)
        if pair is None:
            return []
        message, metadata = pair
        namespace = event[len(MESSAGES) :]
        msg_id = message.get("id")
        chunked = message.get("type") in CHUNK_TYPES
        if not isinstance(msg_id, str) or not msg_id:  # nothing to accumulate under: this chunk alone
            if not chunked:
                return [(_name("complete", namespace), [message])]
            alone = _Message()
            alone.add(message)
            return [(_name("partial", namespace), [alone.render()])]
        key = (namespace, msg_id)
        entry = self._messages.pop(key, None)
        frames: list[Frame] = []
        if entry is None:
            frames.append((_name("metadata", namespace), {msg_id: {"metadata": metadata}}))
        if not chunked:
            frames.append((_name("complete", namespace), [message]))
            return frames
        entry = entry or _Message()
        entry.add(message)
        frames.append((_name("partial", namespace), [entry.render()]))
        if message.get("chunk_position") != "last":
            self._messages[key] = entry  # re-inserted last: the OrderedDict is the LRU order
            while len(self._messages) > self._max:
                self._messages.popitem(last=False)
        return frames


def _chunk(fields: dict[str, Any]) -> BaseMessageChunk:
    part = messages_from_dict([{"type": fields["type"], "data": fields}])[0]
    assert isinstance(part, BaseMessageChunk)
    return part


def _name(kind: str, namespace: str) -> str:
    return f"{MESSAGES}/{kind}{namespace}"
