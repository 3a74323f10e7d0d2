"""The built-in tools an agent gets (workspace tools and ``ask_clarification``), and how a run
picks among them.

Tools are shared, stateless objects: everything run-specific (workspace, limits, change ledger,
process registry) reaches them through the trusted :class:`~agentkeel.harness.context.RunContext`
that LangGraph injects as ``runtime.context``, so an agent graph must be compiled with
``context_schema=RunContext`` and invoked with ``context=RunContext(...)``.

Each built-in declares whether it is idempotent (:mod:`.idempotency`): the read-only tools are, so a
recovered run may repeat them; ``write_file``, ``str_replace`` and ``bash`` are not.
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from agentkeel.harness.tools.clarify import ASK_CLARIFICATION
from agentkeel.harness.tools.files import READ_FILE, STR_REPLACE, WRITE_FILE
from agentkeel.harness.tools.idempotency import declare_idempotent, is_idempotent
from agentkeel.harness.tools.search import GLOB, GREP, LS
from agentkeel.harness.tools.shell import BASH

READ_ONLY_TOOL_NAMES = frozenset({"read_file", "ls", "glob", "grep", "ask_clarification"})
"""The built-ins that change nothing, so running one again is harmless (declared idempotent)."""

_TOOLS: dict[str, BaseTool] = {
    tool.name: declare_idempotent(tool, tool.name in READ_ONLY_TOOL_NAMES)
    for tool in (READ_FILE, WRITE_FILE, STR_REPLACE, LS, GLOB, GREP, BASH, ASK_CLARIFICATION)
}

WORKSPACE_TOOL_NAMES: tuple[str, ...] = tuple(_TOOLS)
"""Names of the built-in tools (the workspace tools and ``ask_clarification``), in the order
:func:`build_tools` returns them."""


def build_tools(bash_enabled: bool, names: list[str] | None = None) -> list[BaseTool]:
    """The workspace tools for an agent: all of them, or those in ``names``.

    ``bash`` is left out unless ``bash_enabled``, even when ``names`` asks for it, so a tool list
    written for one deployment cannot switch shell access on in another. Unknown names are a
    configuration error.
    """
    wanted = list(WORKSPACE_TOOL_NAMES) if names is None else names
    unknown = sorted(set(wanted) - set(_TOOLS))
    if unknown:
        raise ValueError(
            f"unknown tool name(s) {', '.join(unknown)}; "
            f"built-in: {', '.join(WORKSPACE_TOOL_NAMES)}"
        )
    return [
        tool for name, tool in _TOOLS.items() if name in wanted and (bash_enabled or name != "bash")
    ]


__all__ = ["READ_ONLY_TOOL_NAMES", "WORKSPACE_TOOL_NAMES", "build_tools", "is_idempotent"]
