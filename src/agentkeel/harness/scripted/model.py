"""``ScriptedChatModel``: a real ``BaseChatModel`` whose answers come from a script.

It goes through every code path a provider integration does (sync and async, streaming with
``tool_call_chunks``, ``usage_metadata``, provider-shaped ``response_metadata``, provider-shaped
errors), so middleware, the agent loop and stream consumers behave offline exactly as they would
against a provider, and a run can be replayed deterministically.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from langchain_core.caches import BaseCache
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, InvalidToolCall, ToolCall
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, PrivateAttr

from agentkeel.harness.middleware.keys import TASK_ID_METADATA
from agentkeel.harness.scripted.errors import PROVIDER_ERRORS, ScriptExhaustedError, ScriptExpectationError
from agentkeel.harness.scripted.script import FALLBACK_ERROR, Script, Turn, UsageSpec, render
from agentkeel.harness.scripted.strict import check_request
from agentkeel.harness.token_estimate import approx_tokens
from agentkeel.harness.tool_args import parse_arguments


class AgentCursor:
    """How many model calls one agent instance has made, i.e. where it is in its turn list."""

    def __init__(self, agent: str, instance: int, calls: int = 0) -> None:
        self.agent = agent
        self.instance = instance
        self._calls = calls
        # Sync and async calls, or a model shared by parallel branches, may advance it concurrently.
        self._lock = threading.Lock()

    def advance(self) -> int:
        """Count one more model call and return its 1-based turn number."""
        with self._lock:
            self._calls += 1
            return self._calls


class ScriptSession:
    """The cursor state of one run; a harness creates a fresh one per run so every run replays from turn 1.

    ``key`` goes into message and tool-call ids. LangGraph merges messages by id, so two runs on the
    same thread must not both produce ``msg-lead-0-1``; pass the run id for reproducible ids, or
    leave it out to get a random one.
    """

    def __init__(self, key: str | None = None, lead_turns_done: int = 0) -> None:
        self.key = key or uuid.uuid4().hex[:8]
        self._instances: dict[str, int] = {}
        self._lock = threading.Lock()
        # A resumed run's lead continues after the turns its lost attempts already played.
        self._lead_turns_done = lead_turns_done

    def cursor(self, agent: str) -> AgentCursor:
        """Register a new instance of ``agent``; instances of one name are numbered 0, 1, 2... per session."""
        with self._lock:
            instance = self._instances.get(agent, 0)
            self._instances[agent] = instance + 1
        done = self._lead_turns_done if (agent, instance) == ("lead", 0) else 0
        return AgentCursor(agent, instance, done)


# provider -> (response_metadata["model_provider"], finish key, script finish reason -> provider value).
# The provider names are the ones LangChain's own integrations report, so content-block translators
# and provider-aware middleware treat scripted messages like real ones.
_PROVIDERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "openai": (
        "openai",
        "finish_reason",
        {
            "stop": "stop",
            "tool_calls": "tool_calls",
            "length": "length",
            "content_filter": "content_filter",
            "refusal": "content_filter",
            "SAFETY": "content_filter",
        },
    ),
    "anthropic": (
        "anthropic",
        "stop_reason",
        {
            "stop": "end_turn",
            "tool_calls": "tool_use",
            "length": "max_tokens",
            "content_filter": "refusal",
            "refusal": "refusal",
            "SAFETY": "refusal",
        },
    ),
    "gemini": (
        "google_genai",
        "finish_reason",
        {
            "stop": "STOP",
            "tool_calls": "STOP",
            "length": "MAX_TOKENS",
            "content_filter": "SAFETY",
            "refusal": "SAFETY",
            "SAFETY": "SAFETY",
        },
    ),
}


class WireCall(NamedTuple):
    """One tool call as a provider sends it: id, name and the argument text."""

    id: str
    name: str
    args: str


@dataclass(frozen=True)
class _Call:
    """One model call: who made it, which turn it is, and the (rendered) entry that answers it."""

    agent: str
    instance: int
    turn: int
    entry: Turn | None  # None: turns exhausted and the script says `fallback: error`

    @property
    def delay_s(self) -> float:
        return self.entry.delay_ms / 1000 if self.entry else 0.0

    @property
    def stream_chunks(self) -> int:
        return self.entry.stream_chunks if self.entry else 1


class ScriptedChatModel(BaseChatModel):
    """A chat model that replays ``script`` for ``agent``; see ``docs/scripted-model.md``.

    Build one per run with a fresh ``ScriptSession``. The lead's model claims its cursor on first
    use; a subagent builder calls ``for_agent(name)`` to get a twin with a cursor of its own.
    """

    script: Script
    agent: str = "lead"
    session: ScriptSession = Field(default_factory=ScriptSession)
    model_name: str = "scripted"
    # A cache would hand back an old answer instead of advancing the script.
    cache: BaseCache | bool | None = Field(default=False, exclude=True)

    _cursor: AgentCursor | None = PrivateAttr(default=None)
    _cursor_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def _identifying_params(self) -> Mapping[str, Any]:
        return {"model_name": self.model_name, "agent": self.agent}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "scripted"
        return params

    def for_agent(self, agent: str) -> ScriptedChatModel:
        """A copy that plays ``agent``'s list as a new instance of it, sharing this model's session.

        The cursor is claimed now, not on first call, so instance numbers follow creation order,
        which stays deterministic when several subagents then run in parallel.
        """
        twin = self.model_copy(update={"agent": agent})
        twin._cursor = self.session.cursor(agent)
        return twin

    def bind_tools(
        self,
        tools: Sequence[builtins.dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as a provider would receive them; the script, not the tools, decides the calls."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=[_openai_tool(tool) for tool in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._next_call(_task_of(run_manager))
        time.sleep(call.delay_s)
        return ChatResult(generations=[ChatGeneration(message=self._reply(call, messages)[0])])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._next_call(_task_of(run_manager))
        await asyncio.sleep(call.delay_s)
        return ChatResult(generations=[ChatGeneration(message=self._reply(call, messages)[0])])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._next_call(_task_of(run_manager))
        time.sleep(call.delay_s)
        for chunk in _split_reply(*self._reply(call, messages), call.stream_chunks):
            if run_manager is not None and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._next_call(_task_of(run_manager))
        await asyncio.sleep(call.delay_s)
        for chunk in _split_reply(*self._reply(call, messages), call.stream_chunks):
            if run_manager is not None and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _next_call(self, task: str | None = None) -> _Call:
        """Consume one turn. Every call does, even one that then fails, so a retry plays the next entry.

        ``task`` is the delegated task the call serves (a subagent's, from the run config's
        metadata): a ``<agent>@<task>`` list answers it before any other."""
        with self._cursor_lock:
            if self._cursor is None:
                self._cursor = self.session.cursor(self.agent)
            cursor = self._cursor
        turn = cursor.advance()
        entry = self.script.step(cursor.agent, turn, cursor.instance, task)
        if entry is None and self.script.fallback != FALLBACK_ERROR:
            entry = Turn(say=self.script.fallback)
        if entry is not None:
            values = {"turn": str(turn), "agent": cursor.agent, "instance": str(cursor.instance)}
            entry = Turn.model_validate(render(entry.model_dump(by_alias=True, exclude_unset=True), values))
        return _Call(cursor.agent, cursor.instance, turn, entry)

    def _reply(self, call: _Call, messages: Sequence[BaseMessage]) -> tuple[AIMessage, list[WireCall]]:
        """Check the request like a provider would, then answer, or fail as the entry says."""
        if self.script.strict:
            check_request(messages)
        entry = call.entry
        if entry is None:
            raise ScriptExhaustedError(call.agent, call.instance, call.turn)
        request = [message.text for message in messages] + [
            _args_json(tool_call["args"])
            for message in messages
            if isinstance(message, AIMessage)
            for tool_call in message.tool_calls
        ]
        if entry.expect is not None and entry.expect.contains not in "\n".join(request):
            raise ScriptExpectationError(call.agent, call.instance, call.turn, entry.expect.contains)
        if entry.raise_ is not None:
            error = PROVIDER_ERRORS[entry.raise_.kind]
            raise error(
                entry.raise_.message
                or f"scripted {error.kind} (HTTP {error.status_code}) for agent {call.agent!r} "
                f"instance {call.instance} turn {call.turn}"
            )
        return self._answer(call, entry, sum(len(part) for part in request))

    def _answer(self, call: _Call, entry: Turn, request_chars: int) -> tuple[AIMessage, list[WireCall]]:
        """The complete reply (parsed as a provider client parses a non-streamed response) and its
        tool calls as they travel on the wire (what a stream sends, raw argument text included)."""
        ids = f"{self.session.key}-{call.agent}-{call.instance}-{call.turn}"
        tool_calls: list[ToolCall] = []
        invalid: list[InvalidToolCall] = []
        wire: list[WireCall] = []
        for index, spec in enumerate(entry.tool_calls):
            call_id = spec.id or f"call-{ids}-{index}"
            wire.append(WireCall(call_id, spec.name, _args_json(spec.args) if spec.raw_args is None else spec.raw_args))
            if spec.raw_args is None:
                tool_calls.append(ToolCall(name=spec.name, args=spec.args, id=call_id, type="tool_call"))
                continue
            parsed = parse_arguments(spec.raw_args)
            if isinstance(parsed, dict):
                tool_calls.append(ToolCall(name=spec.name, args=parsed, id=call_id, type="tool_call"))
            else:
                invalid.append(InvalidToolCall(
                    name=spec.name, args=spec.raw_args, id=call_id, error=parsed, type="invalid_tool_call",
                ))
        text = entry.say or ""
        answer_chars = len(text) + sum(len(c.args) for c in wire)
        model_provider, finish_key, vocabulary = _PROVIDERS[entry.provider]
        finish = entry.finish_reason or ("tool_calls" if tool_calls or invalid else "stop")
        message = AIMessage(
            content=text,
            tool_calls=tool_calls,
            invalid_tool_calls=invalid,
            id=f"msg-{ids}",
            usage_metadata=_usage(entry.usage, request_chars, answer_chars),
            response_metadata={
                finish_key: vocabulary[finish],
                "model_name": self.model_name,
                "model_provider": model_provider,
            },
        )
        return message, wire


def _args_json(args: Mapping[str, Any]) -> str:
    # `default=str`: history written by other code may hold arguments that are not JSON data.
    return json.dumps(args, ensure_ascii=False, default=str)


def _usage(spec: UsageSpec, request_chars: int, answer_chars: int) -> UsageMetadata:
    input_tokens = approx_tokens(request_chars) if spec.input == "auto" else spec.input
    output_tokens = approx_tokens(answer_chars) if spec.output == "auto" else spec.output
    return UsageMetadata(
        input_tokens=input_tokens, output_tokens=output_tokens, total_tokens=input_tokens + output_tokens
    )


def _pieces(text: str, count: int) -> list[str]:
    """Split ``text`` into at most ``count`` non-empty pieces of near-equal length."""
    bounds = [round(step * len(text) / count) for step in range(count + 1)]
    return [text[start:end] for start, end in zip(bounds, bounds[1:]) if end > start]


def _split_reply(message: AIMessage, wire: list[WireCall], count: int) -> list[ChatGenerationChunk]:
    """The streamed form of ``message``: text, then each tool call's JSON args, then a closing chunk.

    Usage and finish metadata ride only on the closing chunk: chunks are merged with ``+``, which
    adds usage and concatenates string metadata, so repeating them would corrupt the merged message.
    """

    def chunk(**fields: Any) -> ChatGenerationChunk:
        return ChatGenerationChunk(message=AIMessageChunk(id=message.id, **fields))

    chunks = [chunk(content=piece) for piece in _pieces(message.text, count)]
    for index, (call_id, name, text) in enumerate(wire):
        for position, piece in enumerate(_pieces(text, count) or [""]):
            first = position == 0
            fragment = tool_call_chunk(
                name=name if first else None, args=piece, id=call_id if first else None, index=index,
            )
            chunks.append(chunk(content="", tool_call_chunks=[fragment]))
    chunks.append(
        chunk(
            content="",
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
    )
    return chunks


def _task_of(run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None) -> str | None:
    """The task id the harness put in the call's metadata (``TASK_ID_METADATA``), if any."""
    if run_manager is None:
        return None
    task = {**run_manager.inheritable_metadata, **run_manager.metadata}.get(TASK_ID_METADATA)
    return task if isinstance(task, str) else None


def _openai_tool(tool: Any) -> builtins.dict[str, Any]:
    """``tool`` in the OpenAI function format, converted once per (name, description, argument
    schema class). Why: tools are bound at every model call, and converting one walks its pydantic
    schema: a few milliseconds per call for the built-in set. Tools made per run (``task``) share
    their schema class (``tools/_support.make_tool``), so they share the entry; a tool whose
    schema is not a class, a dict or a function is converted each time. The memo is bounded."""
    schema = getattr(tool, "args_schema", None) if isinstance(tool, BaseTool) else None
    if not isinstance(schema, type):
        return convert_to_openai_tool(tool)
    key = (type(tool), tool.name, tool.description, schema)
    converted = _OPENAI_TOOLS.get(key)
    if converted is None:
        if len(_OPENAI_TOOLS) >= _OPENAI_TOOLS_MAX:
            _OPENAI_TOOLS.clear()
        converted = _OPENAI_TOOLS[key] = convert_to_openai_tool(tool)
    return converted


_OPENAI_TOOLS: builtins.dict[tuple[type, str, str, type], builtins.dict[str, Any]] = {}
_OPENAI_TOOLS_MAX = 256
