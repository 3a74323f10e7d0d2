"""Classifying a tool result once, so every guard reads the same verdict.

Several guards care whether a tool call produced value: ToolProgress blocks tools that keep
failing or returning nothing, and reports and replays want to say why. If each guard re-parsed
result text it would disagree with the others on edge cases ("401" inside a URL, an error message
mentioning "no results"). ToolErrorHandling therefore classifies every result exactly once, with
:func:`classify`, and stamps the verdict under :data:`~agentkeel.harness.middleware.keys.TOOL_META`;
the other guards only read the stamp.

Rules, first match wins:

1. ``status="error"`` ToolMessages and texts starting ``Error:`` are errors, refined by keywords
   into ``auth``, ``rate_limited`` or ``config`` (numeric codes on word boundaries only);
2. empty or whitespace-only text, or a short "nothing found" answer, is ``empty``;
3. anything else is ``ok``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from langchain_core.messages import ToolMessage

from agentkeel.harness.middleware.keys import fingerprint
from agentkeel.harness.middleware.responses import text_of

Status = Literal["ok", "error", "empty", "rate_limited", "auth", "config"]
STATUSES: tuple[Status, ...] = ("ok", "error", "empty", "rate_limited", "auth", "config")

# Refinements of an error, in order: a credentials problem explains a rate limit or a disabled
# tool in the same message, not the other way round.
_ERROR_KINDS: tuple[tuple[Status, re.Pattern[str]], ...] = (
    ("auth", re.compile(r"\b40[13]\b|\bunauthori[sz]ed\b|\binvalid[ _-]?api[ _-]?key\b", re.I)),
    ("rate_limited", re.compile(r"\b429\b|\brate[ _-]?limit|\btoo many requests\b", re.I)),
    (
        "config",
        re.compile(
            r"\bnot configured\b|\bnot installed\b|\bmissing[ _-]?api[ _-]?key\b|\bdisabled\b", re.I
        ),
    ),
)

# "Nothing found" answers. Only short texts count: a long result that merely quotes such a phrase
# (a document, a log) carried real content.
_EMPTY = re.compile(
    r"\bno (?:results?|matches|match|hits|paths match|entries|items)\b"
    r"|\b0 (?:results|matches|hits)\b"
    r"|\b(?:not found|did not find|didn't find|could not find|couldn't find) any\b"
    r"|\bfound no\b"
    r"|\bnothing found\b",
    re.I,
)
_EMPTY_MAX_CHARS = 300


def error_kind(text: str) -> Status:
    """The refined status of an error text: ``auth``, ``rate_limited``, ``config`` or ``error``."""
    for status, pattern in _ERROR_KINDS:
        if pattern.search(text):
            return status
    return "error"


def is_empty_text(text: str) -> bool:
    """Whether a successful result says there was nothing (blank, or a short "no results")."""
    stripped = text.strip()
    return not stripped or (len(stripped) <= _EMPTY_MAX_CHARS and _EMPTY.search(stripped) is not None)


def classify(message: ToolMessage, source: str, *, error_type: str | None = None) -> dict[str, Any]:
    """The ``TOOL_META`` verdict for ``message``; ``error_type`` (an exception class) is kept."""
    text = text_of(message)
    if message.status == "error" or text.lstrip().startswith("Error:"):
        status = error_kind(text)
    elif is_empty_text(text):
        status = "empty"
    else:
        status = "ok"
    meta: dict[str, Any] = {"status": status, "fingerprint": fingerprint(text), "source": source}
    if error_type is not None:
        meta["error_type"] = error_type
    return meta


__all__ = ["STATUSES", "Status", "classify", "error_kind", "is_empty_text"]
