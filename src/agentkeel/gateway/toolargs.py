"""Batching the streamed arguments of file-writing tool calls in the message stream modes.

A ``write_file`` or ``str_replace`` call streams a whole file as JSON argument text, token by
token: thousands of ``messages`` events for one call. In ``messages-tuple`` mode each is a frame
of its own; in ``messages`` mode each becomes a frame re-sending the whole message so far, so the
client parses O(n²) bytes for an n-byte argument. :class:`ToolArgBatcher` holds those argument
deltas and sends one merged chunk per batch, upstream of both modes.

What is held, and when it is let go:

* identity = (namespace, message id, tool-call index); a chunk is held only when its identity's
  accumulated tool name is a file tool and it carries nothing but that call's argument text (the
  chunk naming the call passes at once, so the client learns of the call without delay);
* text and reasoning on a held chunk are never delayed: a copy without its tool-call parts is
  sent immediately;
* held text is flushed when the identity changes, before any other event (another chunk, a
  ``custom`` event, an ``error``...), at each ``values`` boundary and by :meth:`flush` at stream end.

How big a batch gets is :class:`BatchPolicy`'s call. A fixed 32 chunks leaves ``messages`` mode
quadratic; the default grows each batch with what the identity already sent, so the flushed
prefixes grow geometrically: O(log n) frames and, summed over frames, O(n) bytes to parse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentkeel.gateway.messages import MESSAGES, Frame, PartialJson, message_pair, tool_calls_of

FILE_TOOLS = frozenset({"write_file", "str_replace"})
"""Tools whose arguments carry whole files, hence the only ones worth holding back."""

_MIRROR_BLOCKS = {"input_json_delta": "partial_json", "tool_call_chunk": "args"}
"""Content blocks that repeat the argument text (Anthropic's deltas, v1 output), by text key."""

_KEEP_IF_EQUAL = frozenset({"model_provider", "output_version"})
"""``response_metadata`` keys LangChain keeps once when merging equal values: repeating them on
every chunk is no payload, so they do not force a visible copy."""

Identity = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """When held argument text is sent.

    ``growth=None`` is the fixed rule: every ``chunks`` chunks. Otherwise the first batch goes
    after ``chunks`` chunks or ``first_chars`` characters (so the start of a file shows promptly)
    and each later one once it holds ``growth`` times what the identity already sent. Flushed
    prefixes then grow by ``1 + growth`` per frame: a ``messages``-mode client parses at most
    about ``(1 + 1/growth)`` times the final argument plus one last frame, in
    ``log(n / first_chars) / log(1 + growth)`` frames. The price is staleness: up to
    ``growth / (1 + growth)`` of an argument may wait for the next flush (a third at 0.5).
    """

    chunks: int = 32
    growth: float | None = 0.5
    first_chars: int = 2048

    def due(self, chunks: int, chars: int, sent: int) -> bool:
        if self.growth is None:
            return chunks >= self.chunks
        if sent == 0:
            return chunks >= self.chunks or chars >= self.first_chars
        return chars >= max(self.first_chars, self.growth * sent)


DEFAULT_POLICY = BatchPolicy()
"""Geometric batches: linear parse work in every message mode."""

FIXED_BATCHES = BatchPolicy(growth=None)
"""DeerFlow's rule, 32 chunks per batch: few frames, but quadratic parse work in ``messages`` mode."""


@dataclass(slots=True)
class _Call:
    name: str | None
    """Name fragments so far while they spell the start of a file tool; ``None`` once they do not."""
    sent: int = 0
    """Argument characters already flushed for this identity."""


@dataclass(frozen=True, slots=True)
class _Split:
    """A holdable chunk taken apart: what must go now, and the tool-only rest."""

    identity: Identity
    visible: dict[str, Any] | None
    shape: dict[str, Any]
    """The tool-only copy with every argument text blanked: chunks join a batch only if theirs is
    equal, which makes the merged chunk exactly what LangChain's chunk addition would give."""
    args: str
    content: str | None
    kwargs: str | None


@dataclass(slots=True)
class _Batch:
    event: str
    identity: Identity
    shape: dict[str, Any]
    metadata: dict[str, Any]
    args: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    kwargs: list[str] = field(default_factory=list)
    chunks: int = 0
    chars: int = 0

    def add(self, split: _Split, metadata: dict[str, Any]) -> None:
        self.args.append(split.args)
        if split.content is not None:
            self.content.append(split.content)
        if split.kwargs is not None:
            self.kwargs.append(split.kwargs)
        self.metadata.update(metadata)
        self.chunks += 1
        self.chars += len(split.args)

    def merged(self) -> Frame:
        """One chunk carrying the whole batch, its ``tool_calls`` derived from the joined text."""
        shape = self.shape
        call = {**shape["tool_call_chunks"][0], "args": "".join(self.args)}
        chunk = {**shape, "tool_call_chunks": [call]}
        if isinstance(shape["content"], list) and shape["content"]:
            block = shape["content"][0]
            chunk["content"] = [{**block, _MIRROR_BLOCKS[block["type"]]: "".join(self.content)}]
        if mirror := shape["additional_kwargs"].get("tool_calls"):
            function = {**mirror[0]["function"], "arguments": "".join(self.kwargs)}
            chunk["additional_kwargs"] = {"tool_calls": [{**mirror[0], "function": function}]}
        chunk["tool_calls"], chunk["invalid_tool_calls"] = tool_calls_of(
            [(call.get("name"), PartialJson(call["args"]), call.get("id"))]
        )
        return self.event, [chunk, self.metadata]


class ToolArgBatcher:
    """Holds file-tool argument deltas of one SSE response; every method returns frames in order.

    It sees raw bridge events: ``push`` for ``messages`` events, ``flush`` before any other event
    the client will see and at the end of the stream (or on error), ``boundary`` for ``values``.
    """

    def __init__(self, policy: BatchPolicy | None = None) -> None:
        self._policy = policy or DEFAULT_POLICY
        self._calls: dict[Identity, _Call] = {}
        self._batch: _Batch | None = None

    @property
    def holding(self) -> bool:
        return self._batch is not None

    def push(self, event: str, data: Any) -> list[Frame]:
        """A ``messages`` / ``messages|ns...`` event: held, or sent after whatever was pending."""
        pair = message_pair(data)
        if pair is None:
            return [*self.flush(), (event, data)]
        message, metadata = pair
        namespace = event[len(MESSAGES) :]
        self._track_names(namespace, message)
        split = _split(namespace, message)
        call = self._calls.get(split.identity) if split else None
        if split is None or call is None or call.name not in FILE_TOOLS:
            frames = [*self.flush(), (event, data)]
            if message.get("chunk_position") == "last":
                self._forget(lambda identity: identity[:2] == (namespace, message.get("id")))
            return frames
        frames = []
        batch = self._batch
        if batch is not None and (batch.identity != split.identity or batch.shape != split.shape):
            frames += self.flush()
        if split.visible is not None:
            frames.append((event, [split.visible, metadata]))
        if self._batch is None:
            self._batch = _Batch(event, split.identity, split.shape, dict(metadata))
        self._batch.add(split, metadata)
        if self._policy.due(self._batch.chunks, self._batch.chars, call.sent):
            frames += self.flush()
        return frames

    def flush(self) -> list[Frame]:
        """Everything pending, merged: call before another event goes out and when the stream ends."""
        batch, self._batch = self._batch, None
        if batch is None:
            return []
        if call := self._calls.get(batch.identity):
            call.sent += batch.chars
        return [batch.merged()]

    def boundary(self, namespace: str) -> list[Frame]:
        """A ``values`` event of ``namespace``: its step is over, so flush and forget its calls."""
        frames = self.flush()
        self._forget(lambda identity: identity[0] == namespace)
        return frames

    def _forget(self, done: Callable[[Identity], bool]) -> None:
        self._calls = {identity: call for identity, call in self._calls.items() if not done(identity)}

    def _track_names(self, namespace: str, message: dict[str, Any]) -> None:
        """Accumulate name fragments per identity while they still spell the start of a file tool."""
        msg_id = message.get("id")
        if not isinstance(msg_id, str):
            return
        for piece in message.get("tool_call_chunks") or ():
            if not isinstance(piece, dict) or not _is_index(piece.get("index")) or not piece.get("name"):
                continue
            identity = (namespace, msg_id, piece["index"])
            call = self._calls.setdefault(identity, _Call(""))
            if call.name is not None:
                name = call.name + str(piece["name"])
                call.name = name if any(tool.startswith(name) for tool in FILE_TOOLS) else None


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _split(namespace: str, message: dict[str, Any]) -> _Split | None:
    """The chunk split into visible and tool-only parts, or ``None`` if it is not a bare argument delta.

    Holdable: an ``AIMessageChunk`` with an id, not the last chunk, with exactly one tool-call
    chunk that has an integer index, no name and string args; argument mirrors (one content
    block, one ``additional_kwargs["tool_calls"]`` entry without a name) are held along with it.
    """
    pieces = message.get("tool_call_chunks")
    msg_id = message.get("id")
    if (
        message.get("type") != "AIMessageChunk"
        or not isinstance(msg_id, str)
        or not msg_id
        or message.get("chunk_position") == "last"
        or not isinstance(pieces, list)
        or len(pieces) != 1
        or not isinstance(piece := pieces[0], dict)
        or not _is_index(piece.get("index"))
        or piece.get("name")
        or not isinstance(piece.get("args"), str)
    ):
        return None
    content = _content_mirror(message.get("content", ""))
    kwargs = _kwargs_mirror(message.get("additional_kwargs") or {})
    if content is None or kwargs is None:
        return None
    (visible_content, block), (visible_kwargs, delta) = content, kwargs
    metadata = message.get("response_metadata") or {}
    visible_metadata = {k: v for k, v in metadata.items() if k not in _KEEP_IF_EQUAL}
    no_calls: dict[str, Any] = {"tool_call_chunks": [], "tool_calls": [], "invalid_tool_calls": []}
    visible = None
    if visible_content or visible_kwargs or visible_metadata or message.get("usage_metadata"):
        visible = {**message, "content": visible_content, "additional_kwargs": visible_kwargs, **no_calls}
    block_key = _MIRROR_BLOCKS[block["type"]] if block is not None else ""
    shape = {
        **message,
        "content": [{**block, block_key: ""}] if block is not None else [] if isinstance(visible_content, list) else "",
        "additional_kwargs": {"tool_calls": [_blank_delta(delta)]} if delta is not None else {},
        "response_metadata": {k: v for k, v in metadata.items() if k in _KEEP_IF_EQUAL},
        "usage_metadata": None,
        **no_calls,
        "tool_call_chunks": [{**piece, "args": ""}],
    }
    return _Split(
        identity=(namespace, msg_id, piece["index"]),
        visible=visible,
        shape=shape,
        args=piece["args"],
        content=block[block_key] if block is not None else None,
        kwargs=delta["function"]["arguments"] if delta is not None else None,
    )


def _content_mirror(content: Any) -> tuple[Any, dict[str, Any] | None] | None:
    """``(visible content, the block repeating the arguments)``; ``None`` if not holdable."""
    if not isinstance(content, list):
        return content, None
    mirrors = [b for b in content if isinstance(b, dict) and b.get("type") in _MIRROR_BLOCKS]
    if not mirrors:
        return content, None
    block = mirrors[0]
    if len(mirrors) > 1 or not isinstance(block.get(_MIRROR_BLOCKS[block["type"]]), str):
        return None
    return [b for b in content if b is not block], block


def _kwargs_mirror(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """``(visible kwargs, the OpenAI-style tool-call delta repeating the arguments)``; ``None`` if not holdable."""
    visible = dict(kwargs)
    raw = visible.pop("tool_calls", None)
    if "function_call" in visible:
        return None
    if raw is None:
        return visible, None
    if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], dict):
        return None
    function = raw[0].get("function")
    if not isinstance(function, dict) or function.get("name") or not isinstance(function.get("arguments"), str):
        return None
    return visible, raw[0]


def _blank_delta(delta: dict[str, Any]) -> dict[str, Any]:
    return {**delta, "function": {**delta["function"], "arguments": ""}}
