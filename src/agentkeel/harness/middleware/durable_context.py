"""DurableContext: what a run already did is captured in state, and put back in front of the model.

Why: compaction takes messages out of what the model is sent. A lead that no longer sees its
``task`` calls delegates the same work again (DeerFlow's "analyze this paper" run dispatched three
batches of three overlapping subagents); one that no longer sees a skill it read stops following
it; one that no longer sees the user's first message loses the goal. So those facts are captured
into the durable channels (:mod:`agentkeel.harness.durable`) while their messages are still in
the thread, and projected back into each request of a compacted thread.

What, in the model call (``wrap_model_call``, its only hook):

* first it captures what the thread's messages hold and the channels do not yet: the original
  request (the thread's first genuine user message, once); results of delegated calls, which update
  their entries from structured metadata only
  (:data:`~agentkeel.harness.middleware.keys.SUBAGENT_RESULT`; without it the ToolMessage's own
  status) — a result's text is never parsed; complete reads of a skill, which become skill
  entries; and the closing of *other* runs' entries still ``in_progress`` (their run is over, so
  whatever their subagents were doing will never report here);
* then, on a compacted thread, it sends :func:`agentkeel.harness.projection.project` of the
  messages (with those captures) instead of the messages: the rules as a system message the
  runtime owns (``system_authority_message``: SystemMessageCoalescing, inner, merges it into the
  one system prompt), the data message, the latest user request, the kept tail;
* on the way back it records each ``task`` call of the response as an ``in_progress`` entry. It
  observes the final response (every guard that withholds or suppresses calls is inner), so only
  calls that will be dispatched are recorded.

The captures and the entries are a state update of the model step itself
(``ExtendedModelResponse``), so an entry is checkpointed with its call before the tool runs: a run
cancelled mid-delegation leaves an entry to close, not nothing. The run's own entries still open
when it ends are settled by the worker (``agentkeel.runtime.delegations``), whatever the end.

Why no ``before_*`` / ``after_*`` hooks: each would be a graph node — a super-step and a checkpoint
per turn (or per run) for every run — and would keep this wrapper out of the composed guard group
(:mod:`~agentkeel.harness.middleware.composed`), which costs a traced hop per model call.

Every hook writes only what changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from langchain.agents.middleware.types import ExtendedModelResponse, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langgraph.types import Command

from agentkeel.harness.compaction import kept_from
from agentkeel.harness.durable import (
    TERMINAL_STATUSES,
    DelegationEntry,
    OriginalRequest,
    SkillEntry,
    closing_updates,
    durable_values,
    merge_delegations,
    merge_skills,
)
from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler, run_context
from agentkeel.harness.middleware.coalescing import SYSTEM_AUTHORITY, coalesce
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.input_sanitization import is_user_input
from agentkeel.harness.middleware.keys import SUBAGENT_RESULT
from agentkeel.harness.middleware.responses import last_ai, text_of
from agentkeel.harness.projection import REQUEST_CHARS, SKILL_CHARS, project
from agentkeel.harness.skills import skill_read
from agentkeel.harness.state import FullAgentState

TASK_TOOL = "task"
DEFAULT_SUBAGENT = "general-purpose"
DESCRIPTION_CHARS = 200
BRIEF_CHARS = 500

OTHER_RUN_ENDED = "its run ended before the delegation finished"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _messages(state: Any) -> list[BaseMessage]:
    get = state.get if isinstance(state, dict) else (lambda k, d=None: getattr(state, k, d))
    return list(get("messages", None) or [])


# -- what is captured ------------------------------------------------------------------------


def first_request(messages: Iterable[BaseMessage]) -> OriginalRequest | None:
    """The thread's first genuine user message with text, bounded."""
    for message in messages:
        if is_user_input(message) and message.id:
            text = text_of(message).strip()
            if text:
                return {"id": message.id, "text": text[:REQUEST_CHARS]}
    return None


def task_entries(
    response: ModelResponse, known: set[str], run_id: str | None
) -> list[DelegationEntry]:
    """An ``in_progress`` entry for each ``task`` call of the response that will be dispatched:
    not already in the ledger (``known``) and not answered in the response itself (a call with
    malformed arguments gets its error result there and never runs)."""
    ai = last_ai(response)
    if ai is None:
        return []
    answered = {m.tool_call_id for m in response.result if isinstance(m, ToolMessage)}
    entries: list[DelegationEntry] = []
    for call in ai.tool_calls:
        call_id = call.get("id")
        if call.get("name") != TASK_TOOL or not call_id or call_id in known or call_id in answered:
            continue
        args = call.get("args") or {}
        description = args.get("description") or args.get("prompt") or ""
        entries.append({
            "id": call_id,
            "run_id": run_id,
            "message_id": ai.id,
            "description": str(description)[:DESCRIPTION_CHARS],
            "subagent_type": str(args.get("subagent_type") or DEFAULT_SUBAGENT),
            "status": "in_progress",
            "created_at": _now(),
        })
    return entries


def subagent_result(message: ToolMessage) -> dict[str, Any] | None:
    """The structured outcome a ``task`` result carries (:data:`SUBAGENT_RESULT`), if any."""
    artifact = message.artifact if isinstance(message.artifact, dict) else {}
    for source in (message.additional_kwargs, artifact):
        value = source.get(SUBAGENT_RESULT)
        if isinstance(value, dict):
            return value
    return None


def result_update(message: ToolMessage) -> DelegationEntry:
    """The ledger update a ``task`` result makes; without metadata, its status decides."""
    return outcome_update(
        message.tool_call_id, subagent_result(message) or {}, "failed" if message.status == "error" else "completed"
    )


def outcome_update(task_id: str, meta: dict[str, Any], fallback: str = "failed") -> DelegationEntry:
    """The ledger update of a task's outcome data (:data:`SUBAGENT_RESULT`); ``fallback``: the
    status when the data names no terminal one."""
    status = meta.get("status")
    if status not in TERMINAL_STATUSES:
        status = fallback
    update: DelegationEntry = {"id": task_id, "status": status}
    stop_reason, brief, sha = meta.get("stop_reason"), meta.get("brief"), meta.get("sha256")
    if isinstance(stop_reason, str) and stop_reason:
        update["stop_reason"] = stop_reason
    if isinstance(brief, str) and brief:
        update["result_brief"] = brief[:BRIEF_CHARS]
    if isinstance(sha, str) and sha:
        update["result_sha256"] = sha
    return update


def result_updates(messages: Sequence[BaseMessage], ledger: Sequence[DelegationEntry]) -> list[DelegationEntry]:
    """Updates for every ``in_progress`` entry whose result is in ``messages``."""
    pending = {e.get("id") for e in ledger if e.get("status") == "in_progress"}
    pending.discard(None)
    if not pending:
        return []
    return [result_update(m) for m in messages if isinstance(m, ToolMessage) and m.tool_call_id in pending]


def _last_batch(messages: Sequence[BaseMessage]) -> tuple[AIMessage | None, Sequence[BaseMessage]]:
    """The last assistant message with tool calls and the messages after it (its results)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage) and message.tool_calls:
            return message, messages[index + 1 :]
    return None, []


def skill_reads(messages: Sequence[BaseMessage], known: set[str | None]) -> list[SkillEntry]:
    """Skill entries for the complete skill reads (:func:`agentkeel.harness.skills.skill_read`)
    of the last tool batch not yet captured."""
    ai, batch = _last_batch(messages)
    if ai is None:
        return []
    calls = {call.get("id"): call for call in ai.tool_calls}
    entries: list[SkillEntry] = []
    for message in batch:
        if not isinstance(message, ToolMessage) or message.id in known:
            continue
        call = calls.get(message.tool_call_id)
        read = skill_read(str(call.get("name")), call.get("args") or {}, message) if call else None
        if read is None:
            continue
        entries.append({
            "name": read.name, "path": read.path, "description": read.description, "sha256": read.sha256,
            "body": read.body[:SKILL_CHARS], "message_id": message.id, "tool_call_id": message.tool_call_id,
        })
    return entries


def captures(messages: Sequence[BaseMessage], durable: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    """The channel updates the thread's messages call for (empty when there are none): the
    original request when none is recorded yet; results of delegated calls and complete skill
    reads not captured yet; and the closing of other runs' entries still ``in_progress`` (their
    run is over: a thread runs one run at a time)."""
    update: dict[str, Any] = {}
    if durable["original_request"] is None:
        original = first_request(messages)
        if original is not None:
            update["original_request"] = original
    found = result_updates(messages, durable["delegations"])
    closing = closing_updates(merge_delegations(durable["delegations"], found), reason=OTHER_RUN_ENDED,
                              keep_run=run_id) if run_id is not None else []
    if found or closing:
        update["delegations"] = [*found, *closing]
    skills = skill_reads(messages, {e.get("message_id") for e in durable["skills"]})
    if skills:
        update["skills"] = skills
    return update


def projected(
    request_messages: Sequence[BaseMessage], state_messages: Sequence[BaseMessage], durable: dict[str, Any]
) -> list[BaseMessage] | None:
    """What the model is sent of a compacted thread, or None when nothing is compacted.

    The stored cut is checked against the thread (state), then located in the request by the id
    of the last compacted message, never by index: a guard outer of this one may have inserted or
    regrouped messages (synthetic results for an interrupted call)."""
    compaction = durable.get("compaction")
    if kept_from(state_messages, compaction) == 0:
        return None
    assert compaction is not None
    through = compaction.get("through_id")
    at = next((i for i in range(len(request_messages) - 1, -1, -1) if request_messages[i].id == through), None)
    if at is None:
        return None
    return project(request_messages, {**durable, "compaction": {**compaction, "compacted": at + 1}})


# -- the middleware --------------------------------------------------------------------------


class DurableContext(KeelMiddleware):
    """Captures delegations, skill reads and the original request; projects compacted threads."""

    state_schema = FullAgentState
    contract: ClassVar[Contract] = Contract(
        axes={
            "model": on(
                provides={SYSTEM_AUTHORITY},
                reads={"model_request.state"},
                mutates={"model_request.messages", "state.delegations", "state.skills", "state.original_request"},
                observes_final={"model_response"},
            ),
        },
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    @staticmethod
    def _run_id(runtime: Any) -> str | None:
        ctx = run_context(runtime)
        return ctx.run_id if ctx is not None else None

    async def awrap_model_call(
        self, request: ModelRequest, handler: ModelHandler
    ) -> ModelResponse | ExtendedModelResponse[Any]:
        handler = self.traced(request, handler, sent_as=coalesce)
        state_messages, durable = _messages(request.state), durable_values(request.state)
        update = captures(state_messages, durable, self._run_id(request.runtime))
        durable = {
            **durable,
            "delegations": merge_delegations(durable["delegations"], update.get("delegations")),
            "skills": merge_skills(durable["skills"], update.get("skills")),
        }
        messages = projected(request.messages, state_messages, durable)
        outgoing = request if messages is None else request.override(messages=_any(messages))
        response = await handler(outgoing)
        known = {str(e.get("id")) for e in durable["delegations"]}
        entries = task_entries(response, known, self._run_id(request.runtime))
        if entries:
            update["delegations"] = [*update.get("delegations", []), *entries]
        if not update:
            return response
        return ExtendedModelResponse(model_response=response, command=Command(update=update))

def _any(messages: list[BaseMessage]) -> list[AnyMessage]:
    return messages  # type: ignore[return-value]


__all__ = [
    "captures",
    "OTHER_RUN_ENDED",
    "TASK_TOOL",
    "DurableContext",
    "first_request",
    "outcome_update",
    "projected",
    "result_update",
    "result_updates",
    "skill_reads",
    "subagent_result",
    "task_entries",
]
