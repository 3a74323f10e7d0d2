"""Turning stream chunks and graph values into JSON: bytes for the stream bridge (``EventEncoder``),
JSON-safe data for the stores and the API (``to_jsonable``)."""

from __future__ import annotations

import dataclasses
import json
import operator
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

import orjson
from langchain_core.messages import BaseMessageChunk
from pydantic import BaseModel

from agentkeel.runtime.content_budget import ContentBudget

Memo = dict[int, tuple[Any, Any]]


def to_jsonable(value: Any, memo: Memo | None = None) -> Any:
    """Recursively convert messages, pydantic models, dataclasses, interrupts and tuples.

    ``memo`` remembers converted pydantic objects by identity (unbounded: for one call's worth of
    values, never a run's). Messages are treated as immutable once emitted, as LangGraph's
    reducers do.
    """
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, memo) for k, v in value.items() if not str(k).startswith("__pregel")}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v, memo) for v in value]
    if isinstance(value, BaseModel):
        if memo is None:
            return to_jsonable(value.model_dump())
        hit = memo.get(id(value))
        if hit is None or hit[0] is not value:
            hit = memo[id(value)] = (value, to_jsonable(value.model_dump(), memo))
        return hit[1]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if hasattr(value, "value") and hasattr(value, "id") and type(value).__name__ == "Interrupt":
        return {"value": to_jsonable(value.value), "id": value.id}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


MEMO_MAX_BYTES = 8 * 1024 * 1024
"""Most encoded message bytes one run's :class:`EventEncoder` remembers (least recently used go
first). A ``values`` stream of a long thread re-sends every message at every step; this keeps the
messages it re-sends encoded, without letting a long run's history pile up in memory. All runs'
memos together are bounded by the process's ``ContentBudget`` (``limits.content_max_bytes``)."""

_LIST_MIN = 8  # shorter lists of messages are inlined from the memo, one by one

_PREGEL = b'"__pregel'
_PREGEL_KEY = re.compile(rb'"__pregel(?:[^"\\]|\\.)*":')  # a key (a string then ":"), not a value


@dataclass(frozen=True)
class _EncodedList:
    items: list[Any]  # the objects encoded, in order: a later list is compared with them by identity
    body: bytes  # their encodings joined by ",", without the brackets


class EventEncoder:
    """Encodes one run's stream events to compact JSON bytes, exactly once each.

    ``orjson`` writes the bytes directly from the chunk (no intermediate JSON-safe copy), and a
    message object seen before is inlined from its remembered bytes (``orjson.Fragment``), so a
    ``values`` step costs the new messages plus a copy of the old ones' bytes (a whole list of
    messages is remembered as one encoding: ``_with_encoded_lists``). The memo is bounded
    by ``max_bytes`` and never holds message *chunks*: a ``messages`` stream sends each token chunk
    once, and remembering them would keep every token of the run.

    With a ``budget``, every remembered byte is charged to it and the memo is a reclaimable cache
    of it: a snapshot, or a run with a smaller memo, needing room makes it shed its oldest
    entries, and an entry the budget has no room for (this memo has its share) is simply not
    remembered. Either way the next encoding of that
    message is done afresh, to the same bytes. ``close`` gives everything back; the worker calls
    it when the run ends.

    The output is what ``to_jsonable`` + ``json.dumps`` gave: the rare chunk that holds a LangGraph
    internal (``__pregel*`` keys, dropped) or a value orjson refuses (an int beyond 64 bits) goes
    through ``to_jsonable`` instead.
    """

    def __init__(self, max_bytes: int = MEMO_MAX_BYTES, budget: ContentBudget | None = None) -> None:
        self._memo: OrderedDict[int, tuple[Any, orjson.Fragment, int]] = OrderedDict()
        self._lists: dict[str, _EncodedList] = {}  # by key of a values chunk: its message list, encoded
        self._unkept: set[str] = set()  # keys whose lists outgrew the bound: left to the memo
        self._bytes = 0
        self._max_bytes = max_bytes
        self._budget = budget
        # The budget may shed this memo from a snapshot's worker thread.
        self._lock = threading.Lock()
        if budget is not None:
            budget.attach(self)

    @property
    def held_bytes(self) -> int:
        """Encoded bytes the memo holds now."""
        return self._bytes

    def encode(self, data: Any) -> bytes:
        encoded, rest = self._with_encoded_lists(data) if type(data) is dict and self._max_bytes else (data, None)
        try:
            out = orjson.dumps(encoded, default=self._default, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:
            out = b""
        scan = out if rest is None else rest  # remembered lists are known to hold no "__pregel"
        if not out or (_PREGEL in scan and _PREGEL_KEY.search(out)):  # rare: the JSON-safe walk
            out = json.dumps(to_jsonable(data), default=str, separators=(",", ":"), ensure_ascii=False).encode()
        return out

    def _with_encoded_lists(self, data: dict[Any, Any]) -> tuple[dict[Any, Any], bytes | None]:
        """``data`` with each list of messages replaced by its encoding (``orjson.Fragment``), and
        the encoding of the other keys (None when nothing was replaced), the only part of the
        output that still needs the ``__pregel`` scan (looking through every message's bytes at
        every step was most of what encoding a long thread's chunk cost).

        Why: a ``values`` chunk holds the thread's whole message list at every step, and even
        inlining each message from the memo is one call back into Python per message per step.
        The encoding of a key's list is remembered, and a list that starts with the same objects
        (by identity, as LangGraph's reducers append) costs its new messages plus one copy of the
        remembered bytes. A list that changed otherwise (a message removed or replaced) is
        encoded anew.
        """
        out = data
        for key, value in data.items():
            if type(value) is not list or len(value) < _LIST_MIN or type(key) is not str:
                continue
            fragment = self._encoded_list(key, value)
            if fragment is not None:
                if out is data:
                    out = dict(data)
                out[key] = fragment
        if out is data:
            return data, None
        try:
            rest = orjson.dumps({k: v for k, v in data.items() if type(out[k]) is not orjson.Fragment},
                                default=self._default, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:
            return out, None
        return out, rest

    def _encoded_list(self, key: str, items: list[Any]) -> orjson.Fragment | None:
        """The encoding of ``items``, remembered under ``key``; None (inline each message from the
        memo, as for any other value) when they are not all messages, or when this run's lists
        under ``key`` stopped fitting in the memo's bound or the process budget."""
        if key in self._unkept:
            return None
        held = self._lists.get(key)
        start, body = 0, b""
        if held is not None and len(items) >= len(held.items) and all(map(operator.is_, held.items, items)):
            start, body = len(held.items), held.body
        new = items[start:]
        if not all(isinstance(item, BaseModel) and not isinstance(item, BaseMessageChunk) for item in new):
            return None
        if new:
            parts = [orjson.dumps(item.model_dump(), default=self._default, option=orjson.OPT_NON_STR_KEYS) for item in new]
            if any(_PREGEL in part for part in parts):  # never remembered: the whole output is scanned
                self._forget_list(key)
                self._unkept.add(key)
                return None
            body = b",".join([body, *parts] if body else parts)
            if not self._keep_list(key, items, body):
                self._unkept.add(key)
                return None
        return orjson.Fragment(b"[" + body + b"]")

    def _keep_list(self, key: str, items: list[Any], body: bytes) -> bool:
        """Remember ``body`` as the encoding of ``items`` in place of the key's previous one,
        charged like a memo entry; False if it does not fit (the previous one is forgotten)."""
        self._forget_list(key)
        size = len(body)
        if size > self._max_bytes:
            return False
        if self._bytes + size > self._max_bytes:
            self.shed(self._bytes + size - self._max_bytes)
        if self._budget is not None and not self._budget.reserve(size, self):
            return False
        with self._lock:
            self._lists[key] = _EncodedList(list(items), body)
            self._bytes += size
        return True

    def _forget_list(self, key: str) -> None:
        with self._lock:
            old = self._lists.pop(key, None)
            if old is not None:
                self._bytes -= len(old.body)
        if old is not None and self._budget is not None:
            self._budget.release(len(old.body))

    def shed(self, nbytes: int) -> int:
        """Forget remembered lists, then the least recently used entries, until ``nbytes`` are
        freed (or none is left)."""
        freed = 0
        with self._lock:
            while self._lists and freed < nbytes:
                freed += len(self._lists.popitem()[1].body)
            while self._memo and freed < nbytes:
                freed += self._memo.popitem(last=False)[1][2]
            self._bytes -= freed
        if freed and self._budget is not None:
            self._budget.release(freed)
        return freed

    def close(self) -> None:
        """Forget everything and give the bytes back to the budget (the run is over)."""
        self.shed(self._bytes)
        if self._budget is not None:
            self._budget.detach(self)

    def _default(self, value: Any) -> Any:
        if isinstance(value, BaseModel):
            if isinstance(value, BaseMessageChunk):
                return value.model_dump()
            key = id(value)  # the memo holds the object, so its id is not reused while remembered
            with self._lock:
                hit = self._memo.get(key)
                if hit is not None:
                    self._memo.move_to_end(key)
            if hit is not None:
                return hit[1]
            encoded = orjson.dumps(value.model_dump(), default=self._default, option=orjson.OPT_NON_STR_KEYS)
            self._remember(key, value, encoded)
            return orjson.Fragment(encoded)
        if isinstance(value, (set, frozenset)):
            return list(value)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return str(value)  # dataclasses (LangGraph's Interrupt among them) never get here

    def _remember(self, key: int, value: Any, encoded: bytes) -> None:
        size = len(encoded)
        if size > self._max_bytes:
            return
        if self._bytes + size > self._max_bytes:  # this run's own bound: its oldest go first
            self.shed(self._bytes + size - self._max_bytes)
        if self._budget is not None and not self._budget.reserve(size, self):
            return  # no room in the process: encoded afresh next time
        with self._lock:
            self._memo[key] = (value, orjson.Fragment(encoded), size)
            self._bytes += size
