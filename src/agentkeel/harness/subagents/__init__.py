"""Subagents: the ``task`` tool, the types it can start, and the executor that runs them bounded."""

from agentkeel.harness.subagents.capacity import Capacity
from agentkeel.harness.subagents.executor import AgentTouches, ChildAgent, SubagentExecutor, TaskEvents
from agentkeel.harness.subagents.outcome import SubagentOutcome, brief_of
from agentkeel.harness.subagents.tool import task_tool
from agentkeel.harness.subagents.types import MAX_DEPTH, TASK_TOOL, SubagentConfigError, SubagentType, resolve_types

__all__ = [
    "MAX_DEPTH",
    "TASK_TOOL",
    "AgentTouches",
    "Capacity",
    "ChildAgent",
    "SubagentConfigError",
    "SubagentExecutor",
    "SubagentOutcome",
    "SubagentType",
    "TaskEvents",
    "brief_of",
    "resolve_types",
    "task_tool",
]
