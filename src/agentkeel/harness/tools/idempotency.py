"""Which tools may safely run twice: the declaration the side-effect ledger decides by.

A run recovered after its worker was lost resumes at the step it was in, so a tool call that had
started may start again. That is harmless for a tool that only reads (``read_file``, ``grep``, …)
and wrong for one that acts (``write_file`` with ``append``, ``bash``, a payment, an e-mail). A
tool says it is safe to repeat with ``tool.metadata["idempotent"] = True``; anything else — no
metadata, another value, a third-party tool that never heard of it — counts as *not* idempotent,
because guessing wrong in that direction costs a question to the model, not a repeated effect.
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

IDEMPOTENT = "idempotent"
"""The ``BaseTool.metadata`` key a tool declares itself idempotent with (value ``True``)."""


def is_idempotent(tool: BaseTool | None) -> bool:
    """Whether ``tool`` declared that running it again has no further effect (None: unknown tool)."""
    if tool is None or not tool.metadata:
        return False
    return tool.metadata.get(IDEMPOTENT) is True


def declare_idempotent(tool: BaseTool, idempotent: bool) -> BaseTool:
    """Set ``tool``'s declaration (keeping its other metadata) and return it."""
    tool.metadata = {**(tool.metadata or {}), IDEMPOTENT: idempotent}
    return tool


__all__ = ["IDEMPOTENT", "declare_idempotent", "is_idempotent"]
