"""The ``task`` tool: how an agent hands a self-contained subtask to a subagent.

A child's is built with the child, bound to its
:class:`~agentkeel.harness.subagents.executor.SubagentExecutor`; a lead's is built once with the
assistant's shared graph and takes the run's executor from the run's scope
(``harness/run_scope.py``). It lists the types the agent may start in its description, and returns
the child's outcome as a ``ToolMessage`` whose ``artifact`` holds the outcome as data (``agentkeel_subagent``). It is not
idempotent: a recovered run never repeats a delegation blindly (the child may have written files).
"""

from __future__ import annotations

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool

from agentkeel.harness.run_scope import scope_of
from agentkeel.harness.subagents.executor import SubagentExecutor
from agentkeel.harness.subagents.types import TASK_TOOL
from agentkeel.harness.tools._support import Runtime, make_tool, run_context
from agentkeel.harness.tools.idempotency import declare_idempotent


def task_tool(executor: SubagentExecutor, max_per_run: int, *, per_run: bool = False) -> BaseTool:
    """The ``task`` tool of one agent, bound to ``executor`` or (``per_run``) to the executor of the
    run's scope, ``executor`` then only giving the description (the types and limits are the
    configuration's, the same for every run)."""

    async def task(description: str, prompt: str, subagent_type: str, runtime: Runtime) -> ToolMessage:
        """Delegate one self-contained subtask to a subagent.

        Args:
            description: A short (3-8 words) name for the subtask, shown to the user.
            prompt: Everything the subagent needs to do the subtask; it sees nothing of this conversation.
            subagent_type: Which kind of subagent to start (see the list in this tool's description).
        """
        run_executor = scope_of(runtime).executor if per_run else executor
        return await run_executor.run(
            description, prompt, subagent_type, runtime.tool_call_id or "", run_context(runtime),
            runtime.config, writer=runtime.stream_writer,
        )

    tool = make_tool(task, TASK_TOOL)
    types = "\n".join(f"- {t.name}: {t.description}" for t in executor.types.values())
    tool.description = (
        "Delegate one self-contained subtask to a subagent. It works in the same /workspace with a "
        "context of its own and returns a short account of what it did; give it everything it needs "
        f"in `prompt`. At most {executor.max_concurrent} task calls per response and {max_per_run} per "
        "run are run: calls beyond that are dropped. Subagent types (`subagent_type`):\n" + types
    )
    return declare_idempotent(tool, False)


__all__ = ["task_tool"]
