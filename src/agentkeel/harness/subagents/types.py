"""Subagent types: what a ``task(subagent_type=...)`` call starts, resolved once at start-up.

A type names a system prompt, the tools the child may use (an allow list, then a deny list, always
within the tools the deployment enabled), its model (``inherit``: the delegating agent's), its
budget in model turns, its wall clock and how deep it may delegate in turn. ``general-purpose``
always exists. Everything is checked when the harness starts, with the config key in the message:
a typo in a tool list must not surface as a subagent silently missing a tool mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentkeel.config import SubagentsConfig, SubagentTypeConfig

TASK_TOOL = "task"
MAX_DEPTH = 3
"""Delegation levels below the lead, whatever a type asks for."""

GENERAL_PURPOSE_PROMPT = (
    "You are a subagent: another agent delegated one self-contained subtask to you. Do exactly that "
    "subtask with the tools you have, in the shared directory /workspace (read a file before you change "
    "it; other agents may have written it). Do not ask questions: nobody can answer them. When you are "
    "done, reply with a short, factual account of what you found or changed (paths, facts, open "
    "problems). That reply is all the delegating agent will see."
)


class SubagentConfigError(ValueError):
    """A ``subagents.types`` entry names a tool or model that does not exist."""


@dataclass(frozen=True)
class SubagentType:
    """A resolved type: ``tools`` are tool names (``task`` only when ``delegation_depth`` > 0)."""

    name: str
    description: str
    system_prompt: str
    tools: tuple[str, ...]
    model: str | None  # None: inherit the delegating agent's model
    max_turns: int
    timeout_s: float
    delegation_depth: int


def resolve_types(config: SubagentsConfig, available_tools: list[str]) -> dict[str, SubagentType]:
    """Every configured type (``general-purpose`` included), checked against ``available_tools``
    (the built-in tools the deployment enabled, without ``task``)."""
    resolved: dict[str, SubagentType] = {}
    for name in config.type_names():
        spec = config.type(name)
        assert spec is not None  # type_names() lists only known names
        index = next((i for i, t in enumerate(config.types) if t.name == name), None)
        resolved[name] = _resolve(spec, config, available_tools, f"subagents.types.{index}" if index is not None else "subagents")
    return resolved


def _resolve(spec: SubagentTypeConfig, config: SubagentsConfig, available: list[str], key: str) -> SubagentType:
    known = {*available, TASK_TOOL}
    for field_name, names in (("tools", spec.tools or []), ("disallowed_tools", spec.disallowed_tools)):
        unknown = sorted(set(names) - known - {"bash"})  # bash may be configured but disabled here
        if unknown:
            raise SubagentConfigError(
                f"{key}.{field_name}: unknown tool name(s) {', '.join(unknown)}; built-in: {', '.join(sorted(known))}"
            )
    allowed = [t for t in available if spec.tools is None or t in spec.tools]
    tools = [t for t in allowed if t not in spec.disallowed_tools]
    depth = min(spec.delegation_depth, MAX_DEPTH)
    if depth > 0 and TASK_TOOL not in spec.disallowed_tools and (spec.tools is None or TASK_TOOL in spec.tools):
        tools.append(TASK_TOOL)
    else:
        depth = 0
    return SubagentType(
        name=spec.name,
        description=spec.description or spec.name,
        system_prompt=spec.system_prompt or GENERAL_PURPOSE_PROMPT,
        tools=tuple(tools),
        model=None if spec.model == "inherit" else spec.model,
        max_turns=spec.max_turns,
        timeout_s=spec.timeout_s if spec.timeout_s is not None else config.timeout_s,
        delegation_depth=depth,
    )


__all__ = [
    "GENERAL_PURPOSE_PROMPT",
    "MAX_DEPTH",
    "TASK_TOOL",
    "SubagentConfigError",
    "SubagentType",
    "resolve_types",
]
