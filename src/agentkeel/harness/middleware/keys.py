"""Metadata keys guards stamp on messages, shared so producers and readers cannot drift apart."""

from __future__ import annotations

import hashlib

TOOL_META = "agentkeel_tool_meta"
"""On a ToolMessage's ``additional_kwargs``: ``{status, fingerprint, source[, error_type]}`` where
``status`` is ``ok | error | empty | rate_limited | auth | config`` and ``source`` is ``tool``,
``exception`` or the name of the guard that produced the result instead of the tool."""

READ_MARK = "agentkeel_read_mark"
"""On a successful ``read_file`` ToolMessage: ``{path, sha256}`` of the whole file as read."""


SUBAGENT_RESULT = "agentkeel_subagent"
"""On a ``task`` ToolMessage (``additional_kwargs``, or its ``artifact`` when that is a dict): how the
delegated work ended, ``{status, stop_reason, brief, sha256}`` — ``status`` a terminal delegation
status (``completed | failed | cancelled | timed_out | capped``), ``brief`` a short account of the
result, ``sha256`` the digest of the whole result. The delegation ledger reads only this, never the
result's text."""


TASK_ID_METADATA = "agentkeel_task_id"
"""Run-config metadata key of a subagent's graph: the ``task`` call id it serves, so the runtime
counts each child's tokens on their own (``UsageMeter.of_task``)."""


SUBAGENT_TYPE_METADATA = "agentkeel_subagent_type"
"""Run-config metadata key of a subagent's graph: its type. Metadata merges child-last, so a call
made at any depth carries the innermost subagent's type (its tags, which LangChain may sort, do not
say which of several ``subagent:*`` tags is the innermost)."""


def fingerprint(text: str) -> str:
    """A short stable digest of a tool result's whole text, for "the same output again" comparisons.

    Nothing is normalised away: two results with the same digest have the same content."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


__all__ = ["READ_MARK", "SUBAGENT_RESULT", "SUBAGENT_TYPE_METADATA", "TASK_ID_METADATA", "TOOL_META", "fingerprint"]
