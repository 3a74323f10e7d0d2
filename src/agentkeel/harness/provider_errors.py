"""What a failed model call means: one classification of provider errors, used everywhere.

A provider SDK raises a different class per status, but what a run must do with the error depends
on its *kind*: a rate limit or a 5xx may pass if we wait; a rejected key, an exhausted quota, a
malformed request, a prompt over the context window or an unknown model fail the same way on every
retry, so retrying them only wastes the user's time (and, for a billing stop, hides the cause
behind "rate limited" for minutes).

The kinds are stable strings, recorded in the journal's ``model.error`` records, in each retry's
intervention and on the failed run's ``error_detail``:

* retriable: ``rate_limit``, ``server_error``, ``timeout``, ``conflict``, ``connection``
* final: ``auth`` (401/403), ``quota`` (OpenAI's ``insufficient_quota``, sent as a 429 although
  it is a billing stop), ``context_length`` (OpenAI ``context_length_exceeded``, Anthropic
  "prompt is too long", and the wording OpenAI-compatible servers use), ``not_found`` (404: an
  unknown model), ``invalid_request`` (any other 400/413/422)

Classification reads what the SDK exception carries — its HTTP status, the provider's error body
(``code`` / ``type`` / ``message``) — and, for errors without a status, the class names along the
MRO, so it works for the OpenAI and Anthropic SDKs and for anything shaped like them, without
importing either package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langgraph.errors import GraphBubbleUp

RETRIABLE_KINDS = frozenset({"rate_limit", "server_error", "timeout", "conflict", "connection"})
FINAL_KINDS = frozenset({"auth", "quota", "invalid_request", "context_length", "not_found"})

# 4xx statuses that say "try again" rather than "your request is wrong".
_RETRIABLE_4XX = {408: "timeout", 409: "conflict", 429: "rate_limit"}
_FINAL_4XX = {400: "invalid_request", 401: "auth", 403: "auth", 404: "not_found", 413: "invalid_request",
              422: "invalid_request"}
# Class-name fragments of SDK exceptions that carry no status (checked along the MRO, in order).
_NAME_KINDS: tuple[tuple[str, str], ...] = (
    ("RateLimit", "rate_limit"),
    ("InternalServerError", "server_error"),
    ("Timeout", "timeout"),
    ("Connection", "connection"),
    ("Authentication", "auth"),
    ("PermissionDenied", "auth"),
    ("NotFound", "not_found"),
)
_QUOTA_CODES = frozenset({"insufficient_quota"})
_CONTEXT_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
# How providers word a prompt over the context window when they send no code for it.
_CONTEXT_WORDING = ("prompt is too long", "maximum context length", "context length", "context window",
                    "context_length_exceeded")


@dataclass(frozen=True)
class ProviderError:
    """What one exception says about the failed call."""

    kind: str | None  # None: not a provider failure we know (a bug, a script error): never retried
    status: int | None
    code: str | None  # the provider's error code or type, when its body has one
    message: str  # the provider's own message, else the exception's text

    @property
    def retriable(self) -> bool:
        return self.kind in RETRIABLE_KINDS


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK exception carries (``status_code``, or its response's)."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int):
            return status
    return None


def _body_error(exc: BaseException) -> dict[str, Any]:
    """The provider's error object: OpenAI's SDK keeps the inner ``error`` as ``body``, Anthropic's
    keeps the whole ``{"type": "error", "error": {...}}``."""
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        return {}
    inner = body.get("error")
    return inner if isinstance(inner, dict) else body


def classify(exc: BaseException) -> ProviderError:
    """The kind, status, provider code and provider message of a failed model call."""
    error = _body_error(exc)
    code_value = error.get("code") or getattr(exc, "code", None) or error.get("type")
    code = code_value if isinstance(code_value, str) else None
    types = {str(v) for v in (error.get("code"), error.get("type"), getattr(exc, "code", None)) if v}
    message = error.get("message") if isinstance(error.get("message"), str) else None
    status = status_of(exc)
    return ProviderError(_kind(exc, status, types, message or str(exc)), status, code, message or str(exc))


def _kind(exc: BaseException, status: int | None, codes: set[str], message: str) -> str | None:
    if not isinstance(exc, Exception) or isinstance(exc, GraphBubbleUp):  # CancelledError is neither
        return None
    if codes & _QUOTA_CODES:
        return "quota"
    if codes & _CONTEXT_CODES:
        return "context_length"
    # The wording alone counts only on a provider's refusal (a 4xx), never on an arbitrary error.
    refused = status is not None and 400 <= status < 500 and status not in _RETRIABLE_4XX
    if refused and any(words in message.lower() for words in _CONTEXT_WORDING):
        return "context_length"
    if status is not None:
        if status >= 500:
            return "server_error"
        if status >= 400:
            return _RETRIABLE_4XX.get(status) or _FINAL_4XX.get(status, "invalid_request")
        return None
    if isinstance(exc, TimeoutError):
        return "timeout"
    names = [cls.__name__ for cls in type(exc).__mro__]
    for fragment, kind in _NAME_KINDS:
        if any(fragment in name for name in names):
            return kind
    return None


__all__ = ["FINAL_KINDS", "RETRIABLE_KINDS", "ProviderError", "classify", "status_of"]
