"""Run requests and everything decided about them before admission.

Validation and config building happen here, *before* a run is admitted, so a request that fails
(unknown assistant, model outside the allowlist or found unusable at start-up, malformed input)
leaves no run behind — DeerFlow validated after admission and leaked ``pending`` runs.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from langchain_core.messages import convert_to_messages
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, Send

from agentkeel.config import Limits
from agentkeel.harness.agents import (
    Harness,
    ModelNotAllowed,
    ModelUnavailable,
    ResolvedAssistant,
    UnknownAssistant,
)
from agentkeel.runtime.records import MultitaskStrategy, OnDisconnect, RunRecord
from agentkeel.runtime.serialization import to_jsonable

STREAM_MODES = frozenset(
    {"values", "updates", "messages", "messages-tuple", "custom", "debug", "tasks", "checkpoints", "events"}
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
# Keys of the trusted runtime context; a caller can never set them.
RESERVED_CONTEXT_KEYS = frozenset({"thread_id", "run_id", "user", "user_id", "attempt"})
# The longest a run may wait to start: a delay beyond it is a mistake (1e300 s kept a run pending forever).
MAX_AFTER_SECONDS = 7 * 24 * 3600.0


RequestProblem = Literal["invalid", "not_found", "not_allowed"]


class RequestError(ValueError):
    """A request that cannot become a run; ``field`` names the offending field.

    ``problem`` says what kind of refusal it is, in domain terms (a malformed value, something the
    request names that does not exist, something it may not use); the gateway maps it to HTTP.
    """

    def __init__(self, field: str, message: str, problem: RequestProblem = "invalid") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.problem = problem


@dataclass
class RunRequest:
    thread_id: str
    assistant_id: str = "lead"
    input: Any = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    stream_mode: list[str] = field(default_factory=lambda: ["values"])
    stream_subgraphs: bool = False
    multitask_strategy: MultitaskStrategy = MultitaskStrategy.reject
    on_disconnect: OnDisconnect = OnDisconnect.continue_
    model_name: str | None = None
    timeout_s: float | None = None
    user: str | None = None  # the authenticated caller; never taken from the body
    command: dict[str, Any] | None = None  # {resume, update, goto}; exclusive with input
    checkpoint: dict[str, Any] | None = None  # {checkpoint_id, checkpoint_ns, checkpoint_map}: fork
    interrupt_before: list[str] | str | None = None  # node names or "*"
    interrupt_after: list[str] | str | None = None
    durability: str | None = None  # sync | async | exit
    after_seconds: float = 0.0  # delay before the run starts (it stays pending meanwhile)
    # Merged into the thread's metadata by the admission's own transaction, if it admits the run
    # (the gateway stamps what last ran on the thread, as the LangGraph server does).
    thread_metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class PreparedRun:
    """A validated request: what the worker needs, computed before admission."""

    request: RunRequest
    assistant: ResolvedAssistant
    graph_input: Any
    config: RunnableConfig
    stream_modes: list[str]
    caller_context: dict[str, Any]
    timeout_s: float
    stream_options: dict[str, Any] = field(default_factory=dict)  # interrupt_*/durability for astream

    def kwargs(self) -> dict[str, Any]:
        """The request as stored on the run record (JSON-safe)."""
        r = self.request
        return {
            "input": to_jsonable(r.input),
            "config": to_jsonable(r.config or {}),
            "context": to_jsonable(self.caller_context),
            "stream_mode": self.stream_modes,
            "stream_subgraphs": r.stream_subgraphs,
            "model_name": self.assistant.model_name,
            "timeout_s": self.timeout_s,
            "command": to_jsonable(r.command),
            "checkpoint": to_jsonable(r.checkpoint),
            "interrupt_before": r.interrupt_before,
            "interrupt_after": r.interrupt_after,
            "durability": r.durability,
            "after_seconds": r.after_seconds,
            "user": r.user,
        }


def request_from_record(record: RunRecord) -> RunRequest:
    """The request a stored run was admitted with, for the worker that claims it (in any process).

    The inverse of ``PreparedRun.kwargs``; ``prepare_run`` validates it again. The delay is not
    repeated: the claim already waited for ``not_before``.
    """
    k = record.kwargs
    return RunRequest(
        thread_id=record.thread_id,
        assistant_id=record.assistant_id,
        input=k.get("input"),
        config=k.get("config") or None,
        context=k.get("context") or None,
        metadata=dict(record.metadata),
        stream_mode=list(k.get("stream_mode") or ["values"]),
        stream_subgraphs=bool(k.get("stream_subgraphs")),
        multitask_strategy=record.multitask_strategy,
        on_disconnect=record.on_disconnect,
        model_name=k.get("model_name"),
        timeout_s=k.get("timeout_s"),
        user=k.get("user"),
        command=k.get("command"),
        checkpoint=k.get("checkpoint"),
        interrupt_before=k.get("interrupt_before"),
        interrupt_after=k.get("interrupt_after"),
        durability=k.get("durability"),
    )


def prepare_run(request: RunRequest, harness: Harness, limits: Limits) -> PreparedRun:
    if not _SAFE_ID.match(request.thread_id or ""):
        raise RequestError("thread_id", "must be 1-128 characters of letters, digits, '_', '.', '-'")
    context = _caller_context(request.context)
    model_name = request.model_name or context.pop("model_name", None)
    if model_name is not None and not isinstance(model_name, str):
        raise RequestError("context.model_name", "must be a string")
    try:
        assistant = harness.resolve(request.assistant_id, model_name)
    except UnknownAssistant as exc:
        raise RequestError("assistant_id", str(exc), "not_found") from None
    except ModelNotAllowed as exc:
        raise RequestError("context.model_name", str(exc), "not_allowed") from None
    if assistant.model_name is not None:
        try:  # found unusable at start-up (package, provider, key): refused, never admitted
            harness.models.ensure_usable(assistant.model_name)
        except ModelUnavailable as exc:
            raise RequestError("context.model_name" if model_name else "assistant_id", str(exc)) from None
        summary = limits.summarization
        if assistant.kind == "agent" and summary.enabled and summary.model not in (None, assistant.model_name):
            try:  # a run that could never compact is refused too, not admitted to fail later
                harness.models.ensure_usable(str(summary.model))
            except ModelUnavailable as exc:
                raise RequestError("limits.summarization.model", str(exc)) from None
    modes = _stream_modes(request.stream_mode)
    timeout = request.timeout_s if request.timeout_s is not None else limits.run_timeout_s
    if timeout <= 0:
        raise RequestError("timeout_s", "must be positive")
    if not (math.isfinite(request.after_seconds) and 0 <= request.after_seconds <= MAX_AFTER_SECONDS):
        raise RequestError("after_seconds", f"must be between 0 and {MAX_AFTER_SECONDS:.0f} seconds (one week)")
    if request.command is not None and request.input is not None:
        raise RequestError("command", "give either input or command, not both")
    config = _run_config(request, limits)
    _apply_checkpoint(cast(dict[str, Any], config), request)
    return PreparedRun(
        request=request,
        assistant=assistant,
        graph_input=_command(request.command) if request.command is not None
        else _graph_input(request.input, assistant),
        config=config,
        stream_modes=modes,
        caller_context=context,
        timeout_s=timeout,
        stream_options=_stream_options(request),
    )


def _command(raw: Any) -> Command:
    if not isinstance(raw, dict):
        raise RequestError("command", "must be an object")
    unknown = sorted(set(raw) - {"resume", "update", "goto"})
    if unknown:
        raise RequestError(f"command.{unknown[0]}", "unknown field (known: resume, update, goto)")
    goto = raw.get("goto")
    if isinstance(goto, dict):
        goto = _send(goto)
    elif isinstance(goto, list):
        goto = [_send(g) if isinstance(g, dict) else g for g in goto]
    kwargs: dict[str, Any] = {"goto": goto or ()}
    if "resume" in raw:
        kwargs["resume"] = raw["resume"]
    if raw.get("update") is not None:
        kwargs["update"] = raw["update"]
    return Command(**kwargs)


def _send(goto: dict[str, Any]) -> Send:
    node = goto.get("node")
    if not isinstance(node, str) or not node:
        raise RequestError("command.goto.node", "must name a node of the graph")
    return Send(node, goto.get("input"))


def _apply_checkpoint(config: dict[str, Any], request: RunRequest) -> None:
    checkpoint = request.checkpoint
    if checkpoint is None:
        return
    if not isinstance(checkpoint, dict):
        raise RequestError("checkpoint", "must be an object")
    if checkpoint.get("thread_id") not in (None, request.thread_id):
        raise RequestError("checkpoint.thread_id", "must be the run's thread")
    for key in ("checkpoint_id", "checkpoint_ns"):
        if checkpoint.get(key) is not None and not isinstance(checkpoint[key], str):
            raise RequestError(f"checkpoint.{key}", "must be a string")
    configurable = config["configurable"]
    configurable["checkpoint_ns"] = checkpoint.get("checkpoint_ns") or ""
    for key in ("checkpoint_id", "checkpoint_map"):
        if checkpoint.get(key) is not None:
            configurable[key] = checkpoint[key]


def _stream_options(request: RunRequest) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name in ("interrupt_before", "interrupt_after"):
        value = getattr(request, name)
        if value is None:
            continue
        if not (value == "*" or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise RequestError(name, 'must be "*" or a list of node names')
        options[name] = value
    if request.durability is not None:
        if request.durability not in ("sync", "async", "exit"):
            raise RequestError("durability", "must be one of sync, async, exit")
        options["durability"] = request.durability
    return options


def _caller_context(context: Any) -> dict[str, Any]:
    if context is None:
        return {}
    if not isinstance(context, dict):
        raise RequestError("context", "must be an object")
    # Dunder keys are private harness channels; identity keys are server-owned.
    return {
        k: v for k, v in context.items()
        if isinstance(k, str) and not k.startswith("__") and k not in RESERVED_CONTEXT_KEYS
    }


def _stream_modes(modes: Any) -> list[str]:
    if modes is None or modes == []:
        return ["values"]
    if isinstance(modes, str):
        modes = [modes]
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        raise RequestError("stream_mode", "must be a string or a list of strings")
    unknown = sorted(set(modes) - STREAM_MODES)
    if unknown:
        raise RequestError("stream_mode", f"unknown mode(s) {unknown}; known: {sorted(STREAM_MODES)}")
    return list(dict.fromkeys(modes))


def _graph_input(raw: Any, assistant: ResolvedAssistant) -> Any:
    if raw is None:
        return None  # continue from the thread's checkpoint
    if isinstance(raw, str) and assistant.kind == "agent":
        raw = {"messages": [{"role": "user", "content": raw}]}
    if not isinstance(raw, dict):
        raise RequestError("input", "must be an object or null")
    if assistant.kind == "graph" or "messages" not in raw:
        return raw
    messages = raw["messages"]
    if not isinstance(messages, list):
        raise RequestError("input.messages", "must be a list")
    converted = []
    for index, message in enumerate(messages):
        try:
            converted.extend(convert_to_messages([message]))
        except Exception as exc:  # LangChain raises several types for malformed messages
            raise RequestError(f"input.messages[{index}]", f"invalid message: {exc}") from None
    return {**raw, "messages": converted}


def _run_config(request: RunRequest, limits: Limits) -> RunnableConfig:
    raw = request.config or {}
    if not isinstance(raw, dict):
        raise RequestError("config", "must be an object")
    config: dict[str, Any] = copy.deepcopy({k: v for k, v in raw.items() if k != "callbacks"})
    configurable = config.get("configurable") or {}
    if not isinstance(configurable, dict):
        raise RequestError("config.configurable", "must be an object")
    configurable = {k: v for k, v in configurable.items() if not str(k).startswith("__")}
    configurable["thread_id"] = request.thread_id  # the addressed thread always wins
    config["configurable"] = configurable
    limit = config.get("recursion_limit", limits.recursion_limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise RequestError("config.recursion_limit", "must be a positive integer")
    config["recursion_limit"] = min(limit, limits.max_recursion_limit)
    metadata = config.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise RequestError("config.metadata", "must be an object")
    if not isinstance(request.metadata, dict):
        raise RequestError("metadata", "must be an object")
    config["metadata"] = {**metadata, **request.metadata}
    return config  # type: ignore[return-value]
