"""LangChain callbacks that journal every model and tool call of a run and count its tokens.

Why a synchronous ``BaseCallbackHandler`` with ``run_inline = True``: LangChain calls such a handler
directly — on the event loop for async runs (in event order, no thread pool hop), and on the calling
thread for sync runs. An ``AsyncCallbackHandler`` in a sync run is driven through ad-hoc event loops
and can be skipped or reordered. Everything the handler touches (``Journal.record``,
``UsageAccumulator.add``) is synchronous and thread-safe.

The handler never raises into the graph: ``raise_error`` is False and every hook is guarded, so a
malformed response costs one journal record, not the run.

A call whose provider reported no usage (no ``usage_metadata``, or zero on both sides — common for
streams from OpenAI-compatible servers) is counted by estimate (:mod:`agentkeel.harness.token_estimate`:
characters of the request's messages and of the response, divided by four) and its ``model.call``
record says ``estimated: true``; the run's usage meter, which the token budget reads, counts it like
any other call, so the budget binds on every path. A failed call's ``model.error`` record carries the
error's ``kind`` and HTTP ``status`` (:mod:`agentkeel.harness.provider_errors`). A subagent's
``tool.call`` carries its result text up to :data:`RESULT_TEXT_MAX_CHARS` (``result_text``); the
``tool.call`` of a tool that raised, the exception's type name and text (``error_type``,
``error_message``, up to :data:`ERROR_MESSAGE_MAX_CHARS`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.outputs import LLMResult
from langgraph.errors import GraphInterrupt

from agentkeel.harness.middleware.keys import TASK_ID_METADATA
from agentkeel.harness.provider_errors import classify
from agentkeel.harness.token_estimate import RequestMeter, approx_tokens, messages_tokens
from agentkeel.runtime.journal import Journal
from agentkeel.runtime.usage import UsageAccumulator, caller_from_tags

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., None])

# The longest subagent tool result journaled as text (``result_text``), so a re-run can answer the
# call from the recording (``runtime/tool_replay.py``); a longer one keeps only its hash. The lead's
# results need none: the thread's checkpointed messages hold them.
RESULT_TEXT_MAX_CHARS = 16_000
# The longest exception text a failed tool call journals (``error_message``): more than the error
# result quotes (``DETAIL_MAX_CHARS``), so a re-run that raises it again gives the model the same text.
ERROR_MESSAGE_MAX_CHARS = 2_000


def _guarded(hook: F) -> F:
    @functools.wraps(hook)
    def wrapper(self: JournalCallbackHandler, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception:
            log.exception("journal callback %s failed (ignored)", hook.__name__)

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class _Started:
    at: float  # time.monotonic()
    caller: str
    name: str  # model name hint (chat models) or tool name
    call_id: str | None = None
    request_tokens: int = 0  # estimated tokens of a model request, used when the provider reports none
    task_id: str | None = None  # the delegated task a subagent's call serves


class JournalCallbackHandler(BaseCallbackHandler):
    """Journals ``model.call`` / ``model.error`` / ``tool.call`` records and feeds ``usage``."""

    raise_error = False
    run_inline = True

    def __init__(self, journal: Journal, usage: UsageAccumulator) -> None:
        self._journal = journal
        self._usage = usage
        # Keyed by LangChain run id; dict get/set/pop are atomic, which is all the threads need.
        self._models: dict[UUID, _Started] = {}
        self._tools: dict[UUID, _Started] = {}
        self._request_meter = RequestMeter()  # each request's estimated size, each message counted once

    # -- steps -------------------------------------------------------------------------------
    @_guarded
    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
        metadata: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        """A task of the root graph (its namespace has no ``|``: a subagent's nested graph has one)
        starts: its superstep is the step every record from now on is stamped with."""
        step = (metadata or {}).get("langgraph_step")
        namespace = str((metadata or {}).get("langgraph_checkpoint_ns") or "")
        if isinstance(step, int) and "|" not in namespace:
            self._journal.at_step(step)

    # -- models ------------------------------------------------------------------------------
    @_guarded
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        request = messages[0] if messages else []
        self._model_started(run_id, tags, metadata, kwargs, self._request_meter.tokens(request))

    @_guarded
    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_started(run_id, tags, metadata, kwargs, approx_tokens(len(prompts[0]) if prompts else 0))

    def _model_started(
        self, run_id: UUID, tags: list[str] | None, metadata: dict[str, Any] | None, kwargs: dict[str, Any],
        request_tokens: int,
    ) -> None:
        params = kwargs.get("invocation_params") or {}
        hint = (metadata or {}).get("ls_model_name") or params.get("model") or params.get("model_name")
        task_id = (metadata or {}).get(TASK_ID_METADATA)
        self._models[run_id] = _Started(
            time.monotonic(), caller_from_tags(tags, metadata), str(hint or ""), request_tokens=request_tokens,
            task_id=task_id if isinstance(task_id, str) else None,
        )

    @_guarded
    def on_llm_end(
        self, response: LLMResult, *, run_id: UUID, tags: list[str] | None = None, **kwargs: Any
    ) -> None:
        started = self._models.pop(run_id, None)
        caller = started.caller if started else caller_from_tags(tags)
        generation = response.generations[0][0] if response.generations and response.generations[0] else None
        message = getattr(generation, "message", None)
        meta: dict[str, Any] = dict(getattr(message, "response_metadata", None) or {})
        info: dict[str, Any] = dict(getattr(generation, "generation_info", None) or {})
        llm_output = response.llm_output or {}
        model = (
            meta.get("model_name")
            or meta.get("model")
            or llm_output.get("model_name")
            or (started.name if started else "")
            or "unknown"
        )
        tokens_in, tokens_out = _token_counts(message, llm_output)
        estimated = tokens_in == 0 and tokens_out == 0
        if estimated:
            tokens_in = started.request_tokens if started else 0
            tokens_out = messages_tokens([message]) if isinstance(message, BaseMessage) else 0
        self._journal.record(
            "model.call",
            {
                "model": model,
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
                "latency_ms": _elapsed_ms(started),
                "finish_reason": meta.get("finish_reason")
                or meta.get("stop_reason")
                or info.get("finish_reason"),
                "tool_calls": len(getattr(message, "tool_calls", None) or []),
                "estimated": estimated,
                **_task_of(started),
                "output": _output(message, meta),
            },
            caller=caller,
        )
        self._usage.add(caller, model, tokens_in, tokens_out, source_id=str(run_id),
                        task_id=started.task_id if started else None)

    @_guarded
    def on_llm_error(
        self, error: BaseException, *, run_id: UUID, tags: list[str] | None = None, **kwargs: Any
    ) -> None:
        started = self._models.pop(run_id, None)
        info = classify(error)
        self._journal.record(
            "model.error",
            {
                "model": (started.name if started else "") or "unknown",
                "error_type": type(error).__name__,
                "kind": info.kind,
                "status": info.status,
                "message": str(error)[:2000],
                "latency_ms": _elapsed_ms(started),
                **_task_of(started),
            },
            caller=started.caller if started else caller_from_tags(tags),
        )

    # -- tools -------------------------------------------------------------------------------
    @_guarded
    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name") or "unknown"
        metadata = kwargs.get("metadata") or {}
        task_id = metadata.get(TASK_ID_METADATA)
        self._tools[run_id] = _Started(
            time.monotonic(), caller_from_tags(tags, metadata), str(name), kwargs.get("tool_call_id"),
            task_id=task_id if isinstance(task_id, str) else None,
        )

    @_guarded
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        started = self._tools.pop(run_id, None)
        message = tool_message(output)
        if message is not None:
            status = "error" if message.status == "error" else "ok"
            call_id: str | None = message.tool_call_id
            size = _size(message.content)
            digest: dict[str, Any] = {"result_sha256": result_digest(message)}
            if started is not None and started.task_id and isinstance(message.content, str) \
                    and len(message.content) <= RESULT_TEXT_MAX_CHARS:
                digest["result_text"] = message.content  # a child's result: no checkpoint holds it
        else:
            status, call_id, size, digest = "ok", None, _size(output), {}
        self._record_tool(started, kwargs, call_id, status, size, **digest)

    @_guarded
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        started = self._tools.pop(run_id, None)
        # An interrupt (e.g. a clarification question) pauses the run; it is not a failing tool.
        status = "interrupted" if isinstance(error, GraphInterrupt) else "error"
        # The exception's text too (whitespace folded, bounded): a re-run raises it again instead
        # of running the tool (runtime/tool_replay.py), so the model reads the same error.
        text = " ".join(str(error).split())[:ERROR_MESSAGE_MAX_CHARS]
        self._record_tool(started, kwargs, None, status, 0, error_type=type(error).__name__, error_message=text)

    def _record_tool(
        self,
        started: _Started | None,
        kwargs: dict[str, Any],
        call_id: str | None,
        status: str,
        result_size: int,
        **extra: Any,
    ) -> None:
        call_id = call_id or (started.call_id if started else None) or kwargs.get("tool_call_id")
        self._journal.record(
            "tool.call",
            {
                "name": started.name if started else kwargs.get("name", "unknown"),
                "call_id": call_id,
                "status": status,
                "duration_ms": _elapsed_ms(started),
                "result_size": result_size,
                **_task_of(started),
                **extra,
            },
            caller=started.caller if started else caller_from_tags(kwargs.get("tags")),
        )


def _task_of(started: _Started | None) -> dict[str, str]:
    """``{task_id}`` of a subagent's call (which child made it: the replay exporter gives each
    child its own list), nothing for the lead's."""
    return {"task_id": started.task_id} if started is not None and started.task_id else {}


def _output(message: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """What the model answered, as ``keel replay --export`` needs it to answer again: the text,
    every tool call (the invalid ones with their raw argument text) and the provider shape."""
    if not isinstance(message, BaseMessage):
        return {}
    return {
        "text": message.text,
        "tool_calls": [{"id": c.get("id"), "name": c.get("name"), "args": c.get("args")}
                       for c in getattr(message, "tool_calls", None) or []],
        "invalid_tool_calls": [{"id": c.get("id"), "name": c.get("name"), "raw_args": c.get("args")}
                               for c in getattr(message, "invalid_tool_calls", None) or []],
        "provider": meta.get("model_provider"),
    }


def result_digest(message: ToolMessage) -> str:
    """The ``result_sha256`` of a tool result: of its text, or of its content blocks as JSON."""
    content = message.content
    text = content if isinstance(content, str) else json.dumps(content, default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _token_counts(message: Any, llm_output: dict[str, Any]) -> tuple[int, int]:
    usage = getattr(message, "usage_metadata", None)
    if usage:
        return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    # Providers that predate ``usage_metadata`` report OpenAI-style counts in ``llm_output``.
    legacy = llm_output.get("token_usage") or {}
    return int(legacy.get("prompt_tokens") or 0), int(legacy.get("completion_tokens") or 0)


def tool_message(output: Any) -> ToolMessage | None:
    """The ToolMessage a tool produced, directly or inside a ``Command(update={"messages": ...})``."""
    if isinstance(output, ToolMessage):
        return output
    update = getattr(output, "update", None)
    if isinstance(update, dict):
        for message in update.get("messages") or []:
            if isinstance(message, ToolMessage):
                return message
    return None


def _size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    try:
        return len(json.dumps(content, default=str))
    except (TypeError, ValueError):
        return len(str(content))


def _elapsed_ms(started: _Started | None) -> int | None:
    return None if started is None else round((time.monotonic() - started.at) * 1000)
