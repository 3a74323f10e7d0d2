"""Repairing a model request so a strict provider accepts it: pure functions over message lists.

A thread's history is not always in the shape a strict provider accepts (HTTP 400 otherwise): a
run cancelled mid-tool leaves a tool call without a result, a compaction can leave an
assistant-first history or results whose call is gone, and a careless middleware can slip a note
between a call and its results or add a second system prompt. Two guards repair requests —
DanglingToolCall (the tool-pairing part, always) and RequestGrammar (everything, as the last
line) — so the repairs live here once, as functions that never touch graph state.

Each function returns the repaired messages and the list of :class:`Repair` s it made; an empty
list means the input was already valid for that part and the output equals it message for message.
Every repair names the grammar rule (:data:`agentkeel.harness.scripted.strict.RULES`) it restores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolCall, ToolMessage

from agentkeel.harness.middleware.tool_call_arguments import argument_error, malformed_result
from agentkeel.harness.scripted.strict import RULES, is_empty_assistant

CONTINUING = "(continuing the conversation)"
_SYNTHETIC_ID = "agentkeel_repair"


@dataclass(frozen=True)
class Repair:
    """One change made to a request: the grammar rule it restores, what was done, and to what."""

    rule: int
    action: str
    subject: str


@dataclass(frozen=True)
class RepairedRequest:
    system_message: SystemMessage | None
    messages: list[BaseMessage]
    repairs: list[Repair]


def interrupted_result(call_id: str, name: str) -> ToolMessage:
    """The synthetic error result for a tool call that never returned."""
    tool = name or "an unnamed tool"
    return ToolMessage(
        content=(
            f"The call to {tool} (id {call_id}) was interrupted and returned no result. "
            f"Nothing is known about its outcome; issue the call again if you still need it."
        ),
        tool_call_id=call_id,
        name=name or None,
        status="error",
    )


def repair_tool_pairing(messages: Sequence[BaseMessage]) -> tuple[list[BaseMessage], list[Repair]]:
    """Put every tool result directly after the assistant message whose call it answers.

    A result answers the nearest earlier unanswered call with its id (else a later one); a second
    result for a call is dropped, a result matching no call is dropped, a call without a result
    gets :func:`interrupted_result`. Everything else keeps its order, so a user message that sat
    between a call and its results ends up after them. Calls with an empty or repeated id get a
    fresh id first (request only), because no result can ever be matched to them.
    """
    promoted, repairs = _promote_invalid_calls(messages)
    normalised, renamed = _normalise_call_ids(promoted)
    repairs.extend(renamed)
    answers, repairs_pairing = _assign_results(normalised)
    repairs.extend(repairs_pairing)
    out: list[BaseMessage] = []
    for index, message in enumerate(normalised):
        if isinstance(message, ToolMessage):
            continue
        promoted_here = isinstance(message, AIMessage) and bool(message.invalid_tool_calls)
        out.append(message.model_copy(update={"invalid_tool_calls": []}) if promoted_here else message)
        if not isinstance(message, AIMessage) or not message.tool_calls:
            continue
        found = answers.get(index, {})
        block_end = _tool_block_end(normalised, index)
        out.extend(normalised[at] for at in sorted(found.values()))
        repairs.extend(
            Repair(3, "regrouped", call_id) for call_id, at in found.items() if not index < at <= block_end
        )
        unparsed = {str(c["id"]): c for c in message.invalid_tool_calls}
        for call in message.tool_calls:
            call_id = str(call["id"])
            if call_id in found:
                continue
            if call_id in unparsed:  # a promoted invalid call: never executed, and we know why
                raw = unparsed[call_id].get("args")
                error = argument_error(raw) or str(unparsed[call_id].get("error") or "unparsable")
                out.append(malformed_result(call_id, call["name"], raw, error, "RequestGrammar"))
            else:
                out.append(interrupted_result(call_id, call["name"]))
            repairs.append(Repair(3, "synthetic_result", call_id))
        last_result = max(found.values(), default=index)
        repairs.extend(
            Repair(5, "user_moved", normalised[at].id or f"message {at}")
            for at in range(index + 1, last_result)
            if isinstance(normalised[at], HumanMessage)
        )
    if all(r.action == "invalid_call_normalised" for r in repairs):
        return list(messages), []  # invalid calls already answered in place: nothing to repair
    return out, repairs


def ensure_user_first(messages: Sequence[BaseMessage]) -> tuple[list[BaseMessage], list[Repair]]:
    """Open the history with a user message when it starts with anything else (or is empty)."""
    start = 1 if messages and isinstance(messages[0], SystemMessage) else 0
    if start < len(messages) and isinstance(messages[start], HumanMessage):
        return list(messages), []
    out = [*messages[:start], HumanMessage(content=CONTINUING), *messages[start:]]
    return out, [Repair(2, "leading_user", CONTINUING)]


def merge_system_messages(
    system_message: SystemMessage | None, messages: Sequence[BaseMessage]
) -> tuple[SystemMessage | None, list[BaseMessage], list[Repair]]:
    """Fold every system message found in ``messages`` into one system prompt (the first stays first).

    A lone system message at the very start, with no request system prompt, is already valid and
    is left where it is.
    """
    found = [m for m in messages if isinstance(m, SystemMessage)]
    if not found or (system_message is None and len(found) == 1 and messages[0] is found[0]):
        return system_message, list(messages), []
    base, extra = (system_message, found) if system_message is not None else (found[0], found[1:])
    rest = [m for m in messages if not isinstance(m, SystemMessage)]
    merged = base.model_copy(update={"content": _join_content([base.content, *(m.content for m in extra)])})
    repairs = [Repair(1, "system_merged", m.id or f"system message {i}") for i, m in enumerate(extra)]
    if system_message is None and messages[0] is not found[0]:
        repairs.append(Repair(1, "system_moved_first", found[0].id or "system message"))
    return merged, rest, repairs


def drop_empty_assistant(messages: Sequence[BaseMessage]) -> tuple[list[BaseMessage], list[Repair]]:
    """Leave out every assistant message with neither content nor tool calls (a model that went
    quiet): it says nothing, and strict providers reject it. Dropped from the request only."""
    out: list[BaseMessage] = []
    repairs: list[Repair] = []
    for index, message in enumerate(messages):
        if is_empty_assistant(message):
            repairs.append(Repair(6, "empty_assistant_dropped", message.id or f"message {index}"))
        else:
            out.append(message)
    return (out, repairs) if repairs else (list(messages), [])


def repair_request(system_message: SystemMessage | None, messages: Sequence[BaseMessage]) -> RepairedRequest:
    """Every repair, in the order that makes the result valid: system prompt, empty assistant
    messages, pairing, opening."""
    system, merged, repairs = merge_system_messages(system_message, messages)
    filled, emptied = drop_empty_assistant(merged)
    paired, pairing = repair_tool_pairing(filled)
    opened, opening = ensure_user_first(paired)
    return RepairedRequest(system, opened, [*repairs, *emptied, *pairing, *opening])


def summarize(repairs: Iterable[Repair]) -> dict[str, Any]:
    """Journal-ready counts: per action, and the names of the grammar rules restored."""
    repairs = list(repairs)
    return {
        "counts": dict(Counter(r.action for r in repairs)),
        "rules": [RULES[rule] for rule in sorted({r.rule for r in repairs})],
    }


def _promote_invalid_calls(messages: Sequence[BaseMessage]) -> tuple[list[BaseMessage], list[Repair]]:
    """Invalid tool calls (unparseable arguments) as ordinary calls with empty arguments.

    Providers receive invalid calls as tool calls, and LangChain answers each with an error result,
    so they must take part in the pairing like any call; their raw arguments are dropped from the
    request because they could not be parsed anyway.
    """
    out: list[BaseMessage] = []
    repairs: list[Repair] = []
    for message in messages:
        if not isinstance(message, AIMessage) or not message.invalid_tool_calls:
            out.append(message)
            continue
        promoted: list[ToolCall] = [
            {"name": c.get("name") or "unknown_tool", "args": {}, "id": c.get("id"), "type": "tool_call"}
            for c in message.invalid_tool_calls
        ]
        # The invalid calls stay listed (request only) so an unanswered one is answered as malformed,
        # not as interrupted; :func:`repair_tool_pairing` drops them once the pairing is done.
        out.append(message.model_copy(update={"tool_calls": [*message.tool_calls, *promoted]}))
        repairs.extend(Repair(3, "invalid_call_normalised", str(c["id"])) for c in promoted)
    return out, repairs


def _normalise_call_ids(messages: Sequence[BaseMessage]) -> tuple[list[BaseMessage], list[Repair]]:
    used = {str(c["id"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls if c["id"]}
    out: list[BaseMessage] = []
    repairs: list[Repair] = []
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage) or not message.tool_calls:
            out.append(message)
            continue
        seen: set[str] = set()
        calls: list[ToolCall] = []
        for pos, call in enumerate(message.tool_calls):
            call_id = call["id"] or ""
            if call_id and call_id not in seen:
                seen.add(call_id)
                calls.append(call)
                continue
            fresh = f"{_SYNTHETIC_ID}_{index}_{pos}"
            while fresh in used:
                fresh += "_"
            used.add(fresh)
            seen.add(fresh)
            calls.append({**call, "id": fresh})
            repairs.append(Repair(3, "call_id_assigned", fresh))
        renamed = any(new is not old for new, old in zip(calls, message.tool_calls))
        out.append(message.model_copy(update={"tool_calls": calls}) if renamed else message)
    return out, repairs


def _assign_results(messages: Sequence[BaseMessage]) -> tuple[dict[int, dict[str, int]], list[Repair]]:
    """For each assistant message (by index): call id -> index of the result that answers it."""
    calls_at: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                calls_at.setdefault(str(call["id"]), []).append(index)
    answers: dict[int, dict[str, int]] = {}
    repairs: list[Repair] = []
    for index, message in enumerate(messages):
        if not isinstance(message, ToolMessage):
            continue
        call_id = message.tool_call_id
        owners = calls_at.get(call_id)
        if not owners:
            repairs.append(Repair(4, "orphan_dropped", call_id))
            continue
        open_owners = [at for at in owners if call_id not in answers.get(at, {})]
        earlier = [at for at in open_owners if at < index]
        owner = earlier[-1] if earlier else (open_owners[0] if open_owners else None)
        if owner is None:
            repairs.append(Repair(3, "duplicate_dropped", call_id))
            continue
        answers.setdefault(owner, {})[call_id] = index
    return answers, repairs


def _tool_block_end(messages: Sequence[BaseMessage], index: int) -> int:
    """The index of the last tool message in the run directly after ``index``."""
    end = index
    while end + 1 < len(messages) and isinstance(messages[end + 1], ToolMessage):
        end += 1
    return end


def _plain_text(block: Any) -> str | None:
    """The text of a string or of a bare text block; None for any other block (an image, or a text
    block carrying more than its text, such as a cache marker, which must stay a block)."""
    if isinstance(block, str):
        return block
    if isinstance(block, dict) and block.get("type") == "text" and set(block) <= {"type", "text"}:
        return str(block.get("text") or "")
    return None


def _join_content(contents: Sequence[Any]) -> Any:
    """The contents of several messages as one: texts joined by a blank line between messages, other
    blocks kept as blocks in place; a plain string when only text remains."""
    out: list[Any] = []
    for content in contents:
        first = True
        for block in [content] if isinstance(content, str) else list(content or []):
            text = _plain_text(block)
            if text == "":
                continue
            if text is not None and out and isinstance(out[-1], str):
                out[-1] += ("\n\n" if first else "") + text
            else:
                out.append(text if text is not None else block)
            first = False
    if all(isinstance(part, str) for part in out):
        return "".join(out)
    return [{"type": "text", "text": part} if isinstance(part, str) else part for part in out]


__all__ = [
    "CONTINUING",
    "Repair",
    "drop_empty_assistant",
    "RepairedRequest",
    "ensure_user_first",
    "interrupted_result",
    "merge_system_messages",
    "repair_request",
    "repair_tool_pairing",
    "summarize",
]
