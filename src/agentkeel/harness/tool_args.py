"""What makes a tool call's raw argument text usable: one rule for everything that reads it.

The rule is the OpenAI client's for a complete reply: ``json.loads`` with ``strict=False`` (a raw
newline inside a string is accepted), an empty or blank text means no arguments, and anything that
is not a JSON object is refused. Two places apply it: the scripted model, deciding whether a
scripted ``raw_args`` becomes a tool call or an ``invalid_tool_call`` (as a provider client
would), and the ToolCallArguments guard, deciding whether a streamed or invalid call may run. They
must agree — a call the scripted model hands over as valid but the guard refuses (or the reverse)
would make the scripted tests of the guard test a provider that does not exist — so the rule lives
here, below both, rather than in the guard's module: the middleware package imports the scripted
package (its strict request rules), so the scripted model importing the guard would be a cycle.
"""

from __future__ import annotations

import json
from typing import Any


def parse_arguments(raw: str) -> dict[str, Any] | str:
    """The arguments object ``raw`` holds, or the reason it holds none (the parse error)."""
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw, strict=False)
    except json.JSONDecodeError as exc:
        return str(exc)
    if not isinstance(parsed, dict):
        return f"the arguments are a JSON {type(parsed).__name__}, not an object"
    return parsed


def argument_error(raw: str | None) -> str | None:
    """Why ``raw`` is not usable as tool-call arguments, or None when it is; None as ``raw`` means
    the text never arrived."""
    if raw is None:
        return "no argument text was received"
    parsed = parse_arguments(raw)
    return parsed if isinstance(parsed, str) else None


__all__ = ["argument_error", "parse_arguments"]
