"""The message grammar strict providers enforce, checked on every scripted request.

Lenient fakes accept any history, so a middleware that drops a tool result, injects a user message
between a tool call and its result, or adds a second system prompt passes every test and then
fails in production with an HTTP 400. Checking the same rules here makes it fail in tests instead,
with the rule and the message index in the error.

Indices are positions in the request's message list as the model receives it, so a system prompt
added by ``create_agent`` is index 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

from agentkeel.harness.scripted.errors import StrictRequestError

RULES: dict[int, str] = {
    1: "single system message, first",
    2: "history starts with a user message",
    3: "each tool call answered right after it, once",
    4: "tool result without a matching tool call",
    5: "user message between tool calls and their results",
    6: "assistant message with neither content nor tool calls",
}

_CHAT_ROLES = {"system": "system", "developer": "system", "user": "human", "assistant": "ai", "tool": "tool"}


def _broken(rule: int, index: int, detail: str) -> StrictRequestError:
    return StrictRequestError(rule, RULES[rule], index, detail)


def _role(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "human"
    if isinstance(message, AIMessage):
        return "ai"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        return _CHAT_ROLES.get(message.role, message.role)
    return message.type


def check_request(messages: Sequence[BaseMessage]) -> None:
    """Raise ``StrictRequestError`` (a ``ScriptedBadRequestError``) on the first broken rule."""
    roles = [_role(message) for message in messages]
    _check_system(roles)
    _check_opening(roles)
    _check_tool_results(messages, roles)
    _check_empty_assistant(messages)


def is_empty_assistant(message: BaseMessage) -> bool:
    """An assistant message with no tool call and no content a provider accepts: empty or blank
    text, and no non-text block. Strict providers (Anthropic among them) reject it."""
    if not isinstance(message, AIMessage) or calls_of(message):
        return False
    content = message.content
    if isinstance(content, str):
        return not content.strip()
    return all(
        isinstance(block, str) and not block.strip()
        or isinstance(block, dict) and block.get("type") == "text" and not str(block.get("text") or "").strip()
        for block in content
    )


def _check_empty_assistant(messages: Sequence[BaseMessage]) -> None:
    for index, message in enumerate(messages):
        if is_empty_assistant(message):
            raise _broken(6, index, "an assistant message with no content and no tool calls")


def _check_system(roles: list[str]) -> None:
    for index, role in enumerate(roles):
        if role != "system" or index == 0:
            continue
        if roles[0] == "system":
            raise _broken(1, index, "a second system message; only one is allowed")
        raise _broken(1, index, "a system message that is not the first message")


def _check_opening(roles: list[str]) -> None:
    start = 1 if roles and roles[0] == "system" else 0
    if start == len(roles):
        raise _broken(2, start, "the request has no message after the system prompt; a user message is required")
    if roles[start] != "human":
        raise _broken(2, start, f"the first non-system message is a {roles[start]} message, not a user message")


def calls_of(message: AIMessage) -> list[tuple[str, str]]:
    """``(id, name)`` of every call a provider receives for this message: the parsed tool calls and
    the invalid ones (provider converters send those as tool calls too, with their raw arguments)."""
    return [(c["id"] or "", c["name"]) for c in message.tool_calls] + [
        (c.get("id") or "", c.get("name") or "") for c in message.invalid_tool_calls
    ]


def _check_tool_results(messages: Sequence[BaseMessage], roles: list[str]) -> None:
    earlier_calls: set[str] = set()
    index = 0
    while index < len(messages):
        message = messages[index]
        if isinstance(message, AIMessage) and calls_of(message):
            index = _check_answers(messages, roles, index, message, earlier_calls)
            continue
        if isinstance(message, ToolMessage):
            # A tool message outside the run that follows an assistant tool-call message.
            call_id = message.tool_call_id
            if call_id in earlier_calls:
                raise _broken(3, index, f"the tool result for call {call_id!r} does not directly follow its call")
            raise _broken(4, index, f"tool_call_id {call_id!r} matches no earlier assistant tool call")
        index += 1


def _check_answers(
    messages: Sequence[BaseMessage], roles: list[str], index: int, calls: AIMessage, earlier_calls: set[str]
) -> int:
    """Check the tool messages after ``calls`` (at ``index``); return the next index to scan."""
    pending: dict[str, str] = {}
    for call_id, name in calls_of(calls):
        if not call_id or call_id in pending:
            raise _broken(3, index, f"tool call {name!r} has a missing or duplicate id {call_id!r}")
        pending[call_id] = name
    answered: set[str] = set()
    cursor = index + 1
    while cursor < len(messages) and isinstance(result := messages[cursor], ToolMessage):
        call_id = result.tool_call_id
        if call_id in answered:
            raise _broken(3, cursor, f"a second tool result for call {call_id!r}")
        if call_id not in pending:
            if call_id in earlier_calls:
                raise _broken(3, cursor, f"the tool result for call {call_id!r} does not directly follow its call")
            raise _broken(4, cursor, f"tool_call_id {call_id!r} matches no earlier assistant tool call")
        del pending[call_id]
        answered.add(call_id)
        cursor += 1
    earlier_calls.update(answered, pending)
    if pending:
        _check_user_interleaved(messages, roles, cursor, pending)
        found = f"a {roles[cursor]} message at {cursor}" if cursor < len(messages) else "the end of the request"
        missing = ", ".join(f"{call_id!r} ({name})" for call_id, name in pending.items())
        raise _broken(3, index, f"tool call(s) {missing} have no tool result right after the call; found {found}")
    return cursor


def _check_user_interleaved(
    messages: Sequence[BaseMessage], roles: list[str], start: int, pending: dict[str, str]
) -> None:
    """Rule 5: the missing results do come later, but a user message was slipped in before them."""
    for index in range(start, len(messages)):
        message = messages[index]
        if isinstance(message, ToolMessage) and message.tool_call_id in pending:
            user_turns = [at for at in range(start, index) if roles[at] == "human"]
            if user_turns:
                raise _broken(5, user_turns[0], f"a user message before the result of tool call {message.tool_call_id!r}")
            return
