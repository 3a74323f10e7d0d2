"""Exceptions of the scripted model.

Two families, kept apart on purpose. ``ScriptError`` and its subclasses mean the *script* is wrong
or has been outplayed: a test author must fix something, so no retry policy should swallow them.
``ScriptedProviderError`` and its subclasses imitate what a real provider SDK raises (an HTTP status
code and a kind), so retry, fallback and error-classification middleware can be exercised offline
exactly as they would meet a failing provider.
"""

from __future__ import annotations

from typing import ClassVar


class ScriptError(Exception):
    """A script is malformed, or a run asked it for something it cannot give."""


class ScriptExhaustedError(ScriptError):
    """An agent instance called the model after its turns ran out and the script says ``fallback: error``."""

    def __init__(self, agent: str, instance: int, turn: int) -> None:
        super().__init__(
            f"scripted agent {agent!r} (instance {instance}) was called for turn {turn}, "
            "but its scripted turns are used up and the script sets `fallback: error`"
        )
        self.agent = agent
        self.instance = instance
        self.turn = turn


class ScriptExpectationError(ScriptError):
    """A turn's ``expect.contains`` text was absent from the request the model received."""

    def __init__(self, agent: str, instance: int, turn: int, expected: str) -> None:
        super().__init__(
            f"scripted agent {agent!r} (instance {instance}) turn {turn}: "
            f"the request does not contain the expected text {expected!r}"
        )
        self.agent = agent
        self.instance = instance
        self.turn = turn
        self.expected = expected


class ScriptedProviderError(Exception):
    """Base of the provider-shaped failures; ``status_code`` and ``kind`` mirror an SDK error."""

    kind: ClassVar[str]
    status_code: ClassVar[int]

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ScriptedRateLimitError(ScriptedProviderError):
    kind = "rate_limit"
    status_code = 429


class ScriptedServerError(ScriptedProviderError):
    kind = "server_error"
    status_code = 500


class ScriptedBadRequestError(ScriptedProviderError):
    kind = "bad_request"
    status_code = 400


class ScriptedTimeoutError(ScriptedProviderError, TimeoutError):
    """A request that timed out; also a ``TimeoutError`` so generic timeout handling catches it.

    A client-side timeout has no HTTP response; 408 (Request Timeout) is the nearest status, and it
    keeps ``status_code`` an ``int`` for every provider error so classifiers never meet ``None``.
    """

    kind = "timeout"
    status_code = 408


class StrictRequestError(ScriptedBadRequestError):
    """The request broke the message grammar a strict provider enforces (HTTP 400)."""

    def __init__(self, rule: int, rule_name: str, index: int, detail: str) -> None:
        super().__init__(f"strict request check, rule {rule} ({rule_name}) broken at message {index}: {detail}")
        self.rule = rule
        self.rule_name = rule_name
        self.index = index


PROVIDER_ERRORS: dict[str, type[ScriptedProviderError]] = {
    cls.kind: cls
    for cls in (ScriptedRateLimitError, ScriptedServerError, ScriptedBadRequestError, ScriptedTimeoutError)
}
"""Error class for each ``raise.kind`` a script may name."""
