"""Request bodies of the run routes, and how one becomes a runtime ``RunRequest``.

Field names and defaults are the LangGraph Agent Server's, so the official SDKs drive these routes
unchanged; unknown fields are tolerated as that server does. Fields AgentKeel cannot honour are
refused with a 422 naming the field when set, never silently ignored: ``webhook``,
``feedback_keys``, ``langsmith_tracer``. ``strict_resume`` is honoured (by the run routes). The
deprecated ``checkpoint_during`` is mapped to the ``durability`` it stands for.

The runtime validates and builds the run's config (dunder keys dropped, thread id stamped,
recursion limit clamped, model allowlist checked); what is done here is only what needs the
gateway's knowledge: the assistant's stored config, and server-owned identity keys.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentkeel.gateway.input_limits import Id
from agentkeel.runtime.assistants import AssistantTarget
from agentkeel.runtime.records import MultitaskStrategy, OnDisconnect
from agentkeel.runtime.requests import MAX_AFTER_SECONDS, RESERVED_CONTEXT_KEYS, RequestError, RunRequest

Durability = Literal["sync", "async", "exit"]
# Identity of the caller: re-stamped by the server (``RunRequest.user``), never taken from a body.
_SERVER_OWNED_PREFIXES = ("langgraph_auth_",)


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    assistant_id: str
    input: Any = None
    command: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None  # accepted: every AgentKeel run is resumable
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    durability: Durability | None = None
    checkpoint_during: bool | None = None
    multitask_strategy: MultitaskStrategy = MultitaskStrategy.enqueue
    if_not_exists: Literal["reject", "create"] = "reject"
    on_disconnect: OnDisconnect = OnDisconnect.continue_
    after_seconds: float = Field(default=0.0, ge=0, le=MAX_AFTER_SECONDS, allow_inf_nan=False)
    webhook: Any = None
    feedback_keys: Any = None
    langsmith_tracer: Any = None
    strict_resume: bool | None = None  # a resume is refused (409) when no interrupt is waiting

    @field_validator("webhook", "feedback_keys", "langsmith_tracer")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by AgentKeel (leave it unset)")
        return value

    def to_request(self, thread_id: str, assistant: AssistantTarget, user: str | None = None) -> RunRequest:
        """The runtime request for a run on ``thread_id`` (the URL's id always wins). ``user`` is
        the authenticated caller (``gateway/auth.py``; ``None`` without authentication): nothing
        in a body can set ``RunRequest.user``."""
        if self.context and (self.config or {}).get("configurable"):
            raise RequestError(
                "context", "give either context or config.configurable, not both", "not_allowed"
            )
        return RunRequest(
            thread_id=thread_id,
            assistant_id=assistant.graph_id,
            input=self._input(),
            command=self.command,
            config=self._config(assistant),
            context={**assistant.context, **(self.context or {})} or None,
            metadata=dict(self.metadata or {}),
            stream_mode=self.stream_mode,  # type: ignore[arg-type]  # the runtime normalizes str | list
            stream_subgraphs=bool(self.stream_subgraphs),
            multitask_strategy=self.multitask_strategy,
            on_disconnect=self.on_disconnect,
            checkpoint=self._checkpoint(),
            interrupt_before=self.interrupt_before,
            interrupt_after=self.interrupt_after,
            durability=self._durability(),
            after_seconds=self.after_seconds,
            user=user,
        )

    def _input(self) -> Any:
        """With a ``command``, an empty ``input`` (``{}``, as chat UIs send when resuming) means
        none, as on the LangGraph server; a non-empty one is still refused by the runtime, since
        that server would silently drop it."""
        return None if self.command is not None and self.input == {} else self.input

    def _config(self, assistant: AssistantTarget) -> dict[str, Any]:
        config = {**copy.deepcopy(assistant.config), **copy.deepcopy(self.config or {})}
        requested = (self.config or {}).get("configurable") or {}
        if not isinstance(requested, dict):
            raise RequestError("config.configurable", "must be an object")
        configurable = {**(assistant.config.get("configurable") or {}), **requested}
        config["configurable"] = {
            k: v for k, v in configurable.items()
            if k not in RESERVED_CONTEXT_KEYS and not str(k).startswith(_SERVER_OWNED_PREFIXES)
        }
        return config

    def _checkpoint(self) -> dict[str, Any] | None:
        if self.checkpoint is None and self.checkpoint_id is None:
            return None
        checkpoint = dict(self.checkpoint or {})
        if self.checkpoint_id is not None:
            checkpoint.setdefault("checkpoint_id", self.checkpoint_id)
        return checkpoint

    def _durability(self) -> str | None:
        if self.checkpoint_during is None:
            return self.durability
        implied = "async" if self.checkpoint_during else "exit"
        if self.durability not in (None, implied):
            raise RequestError(
                "checkpoint_during", f"contradicts durability={self.durability!r} (it means {implied!r})"
            )
        return implied


class StatelessRunCreate(RunCreate):
    """``POST /runs[...]``: the run gets a temporary thread unless ``config.configurable.thread_id``
    names one; ``on_completion=delete`` removes the thread the gateway created once the run ends."""

    on_completion: Literal["delete", "keep"] = "delete"


class RunsCancel(BaseModel):
    """``POST /runs/cancel``: runs of one thread (all its active runs, or ``run_ids``), or every
    run in a status."""

    model_config = ConfigDict(extra="ignore")

    thread_id: Id | None = None
    run_ids: list[Id] | None = None
    status: Literal["pending", "running", "all"] | None = None
