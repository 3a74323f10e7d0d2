"""The strict-provider message grammar (``docs/scripted-model.md``), as a check on any request.

The rules are the scripted model's strict mode (:mod:`agentkeel.harness.scripted.strict`), applied
to a request as the provider receives it: the system prompt first, then the messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage

from agentkeel.harness.scripted.errors import StrictRequestError
from agentkeel.harness.scripted.strict import check_request


class RequestGrammarError(ValueError):
    """A middleware produced a request a strict provider would reject (HTTP 400)."""

    def __init__(self, producer: str, broken: StrictRequestError) -> None:
        super().__init__(f"{producer} produced a request that breaks the provider grammar: {broken}")
        self.producer = producer
        self.rule = broken.rule
        self.index = broken.index


def grammar_violation(
    system_message: BaseMessage | None, messages: Sequence[BaseMessage]
) -> StrictRequestError | None:
    """The first grammar rule the request breaks, or None."""
    try:
        check_request([system_message, *messages] if system_message is not None else list(messages))
    except StrictRequestError as broken:
        return broken
    return None


__all__ = ["RequestGrammarError", "grammar_violation"]
