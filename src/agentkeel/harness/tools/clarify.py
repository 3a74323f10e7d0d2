"""``ask_clarification``: the agent's one way to put a question to the user.

The question itself is delivered by the ``Clarification`` middleware, which pauses the run with a
LangGraph interrupt and answers the call with the user's reply when the run resumes; the tool body
never runs there. The body is what an agent gets where nobody can answer (a subagent, a
non-interactive chain without that middleware): a plain instruction to carry on, so the agent does
not wait for a reply that will never come.
"""

from __future__ import annotations

from agentkeel.harness.tools._support import Runtime, make_tool

NO_USER_ANSWER = "No user is available to answer; proceed on your best judgement and state your assumptions."


def ask_clarification(question: str, runtime: Runtime, options: list[str] | None = None) -> str:
    """Ask the user a question when the task is ambiguous or a risky choice needs their decision.

    When a user is present the run pauses until they answer. Ask before acting, not after, and do
    not combine this with other tool calls in the same response.

    Args:
        question: The question, self-contained and specific.
        options: Suggested answers the user can pick from, if the choice is between a few options.
    """
    return NO_USER_ANSWER


ASK_CLARIFICATION = make_tool(ask_clarification, "ask_clarification")

__all__ = ["ASK_CLARIFICATION", "NO_USER_ANSWER", "ask_clarification"]
