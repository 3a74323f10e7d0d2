"""The ``limits:`` section of the config: control-plane bounds and every guard's thresholds.

Each guard's defaults are documented here and in ``docs/guards.md``; a wrong type or an
inconsistent pair (a hard limit under its warning) stops start-up with the key path. Guards that
every chain must carry (``mandatory_for`` in their contract) have no ``enabled`` switch: raise their
thresholds instead of removing them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FrequencyOverride(_Strict):
    warn: PositiveInt
    hard_limit: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> FrequencyOverride:
        if self.hard_limit < self.warn:
            raise ValueError("hard_limit must be >= warn")
        return self


class LoopDetectionLimits(_Strict):
    """Identical tool-call sets and per-tool frequency (``loop_capped``)."""

    warn_threshold: PositiveInt = 3
    hard_limit: PositiveInt = 5
    window_size: PositiveInt = 20
    tool_freq_warn: PositiveInt = 30
    tool_freq_hard_limit: PositiveInt = 50
    tool_freq_overrides: dict[str, FrequencyOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ordered(self) -> LoopDetectionLimits:
        if self.hard_limit < self.warn_threshold:
            raise ValueError("hard_limit must be >= warn_threshold")
        if self.tool_freq_hard_limit < self.tool_freq_warn:
            raise ValueError("tool_freq_hard_limit must be >= tool_freq_warn")
        if self.window_size < self.hard_limit:
            raise ValueError("window_size must be >= hard_limit, or the hard limit can never fire")
        return self


class TokenBudgetLimits(_Strict):
    """Cumulative input + output tokens of the run, subagents included (``token_capped``)."""

    max_tokens: Annotated[int, Field(ge=1000)] = 2_000_000
    max_input_tokens: Annotated[int, Field(ge=1)] | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    warn_fraction: Fraction = 0.8


class TurnLimits(_Strict):
    """Model turns of one agent (``turn_capped``); counts model calls, not graph super-steps."""

    max_turns: PositiveInt = 50


class ToolProgressLimits(_Strict):
    """Tools that stopped producing value (``tool_blocked``)."""

    enabled: bool = True
    stagnation_threshold: PositiveInt = 3
    warn_escalation: PositiveInt = 2
    similarity: Fraction = 0.8
    min_words: PositiveInt = 10
    exempt_tools: list[str] = Field(default_factory=lambda: ["ask_clarification", "task"])
    # Tools that act rather than inform: the same confirmation twice ("Appended 7 bytes to ...") is
    # expected, not a sign of stagnation; their errors and empty results still count.
    action_tools: list[str] = Field(default_factory=lambda: ["write_file", "str_replace"])


class ToolOutputLimits(_Strict):
    """Oversized tool results go to the workspace; the context gets a head/tail excerpt."""

    enabled: bool = True
    externalize_min_chars: Annotated[int, Field(ge=1000)] = 12_000
    head_chars: Annotated[int, Field(ge=0)] = 2_000
    tail_chars: Annotated[int, Field(ge=0)] = 1_000
    storage_dir: str = "/workspace/.tool-results"
    exempt_tools: list[str] = Field(default_factory=lambda: ["read_file"])

    @model_validator(mode="after")
    def _excerpt_fits(self) -> ToolOutputLimits:
        if self.head_chars + self.tail_chars >= self.externalize_min_chars:
            raise ValueError("head_chars + tail_chars must be < externalize_min_chars")
        return self


class SwitchLimits(_Strict):
    enabled: bool = True


class SanitizationLimits(_Strict):
    """Neutralising framework-authority tags in tool results (injection via tool output)."""

    enabled: bool = True
    # Workspace file tools show the user's own files verbatim: escaping them would make the model
    # copy escaped text into ``str_replace`` and miss.
    exempt_tools: list[str] = Field(default_factory=lambda: ["read_file", "ls", "glob", "grep"])


class LLMRetryLimits(_Strict):
    """Bounded retries of rate limits, 5xx and timeouts. ``max_attempts`` is the number of requests
    one model call makes (the provider clients' own retries are off); ``max_retry_after_ms`` caps
    the wait a provider's ``Retry-After`` asks for."""

    max_attempts: PositiveInt = 3
    base_delay_ms: Annotated[int, Field(ge=0)] = 1000
    max_delay_ms: Annotated[int, Field(ge=0)] = 8000
    max_retry_after_ms: Annotated[int, Field(ge=0)] = 60_000

    @model_validator(mode="after")
    def _ordered(self) -> LLMRetryLimits:
        if self.max_delay_ms < self.base_delay_ms:
            raise ValueError("max_delay_ms must be >= base_delay_ms")
        return self


class RequestGrammarLimits(_Strict):
    """``strict``: a request that breaks the provider grammar is an error naming the middleware
    that produced it; ``repair``: it is repaired and the repair journaled. A strict scripted model
    always makes the chain strict."""

    mode: Literal["repair", "strict"] = "repair"


class SummarizationLimits(_Strict):
    """Compaction: what the model is sent shrinks to a summary plus the kept tail; the thread keeps
    every message. Off by default; enabled without a trigger is a config error (it could never
    fire). ``model``: a name from ``models`` (checked at start-up); None: the run's own model."""

    enabled: bool = False
    trigger_tokens: Annotated[int, Field(ge=100)] | None = None
    trigger_messages: Annotated[int, Field(ge=2)] | None = None
    keep_messages: Annotated[int, Field(ge=1)] = 20
    model: str | None = None

    @model_validator(mode="after")
    def _triggered(self) -> SummarizationLimits:
        if self.enabled and self.trigger_tokens is None and self.trigger_messages is None:
            raise ValueError(
                "summarization is enabled without a trigger: set trigger_tokens or trigger_messages"
            )
        if self.trigger_messages is not None and self.keep_messages >= self.trigger_messages:
            raise ValueError("keep_messages must be < trigger_messages, or every turn would compact")
        return self


class SubagentSummarizationLimits(SummarizationLimits):
    """Compaction of a subagent's thread (``subagents.summarization``), used when
    ``limits.summarization`` is off. On by default and it cannot be turned off: summarization is
    mandatory for subagent chains (DeerFlow's subagents ran out of context window with no
    compaction), so a deployment that wants less of it raises the trigger instead."""

    enabled: bool = True
    trigger_tokens: Annotated[int, Field(ge=100)] | None = 64_000

    @field_validator("enabled")
    @classmethod
    def _mandatory(cls, enabled: bool) -> bool:
        if not enabled:
            raise ValueError(
                "summarization is mandatory for subagents and cannot be disabled; raise "
                "subagents.summarization.trigger_tokens instead"
            )
        return enabled


class Limits(_Strict):
    """Budgets, bounds and timeouts of the control plane, and the guards' thresholds."""

    run_timeout_s: Annotated[float, Field(gt=0)] = 1800.0
    recursion_limit: Annotated[int, Field(ge=1)] = 250
    max_recursion_limit: Annotated[int, Field(ge=1)] = 10_000
    bash_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    bash_output_cap: Annotated[int, Field(ge=256)] = 32_000
    workspace_tool_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    # The most file content one read_file call returns (and holds, beside one read chunk), and the
    # largest file write_file / str_replace produce: bounded memory whatever the file size.
    file_read_max_bytes: Annotated[int, Field(ge=1)] = 100_000
    file_write_max_bytes: Annotated[int, Field(ge=1)] = 10_000_000
    snapshot_max_file_bytes: Annotated[int, Field(ge=0)] = 1_000_000
    snapshot_max_total_bytes: Annotated[int, Field(ge=0)] = 64_000_000
    # Process-wide: the most run content all runs of this process hold in memory together - their
    # "before" workspace snapshots' file content and their stream encoders' memos (which give way
    # first). A file that no longer fits is captured as a hash only: a rollback of it is refused.
    content_max_bytes: Annotated[int, Field(ge=0)] = 256 * 1024 * 1024
    stream_retention: Annotated[int, Field(ge=1)] = 10_000
    stream_ttl_s: Annotated[float, Field(gt=0)] = 3600.0
    stream_heartbeat_s: Annotated[float, Field(gt=0)] = 5.0
    # A finished run's stream is kept this long after its END (at most ``stream_ttl_s``); later
    # joins are answered from the run record, with a ``gap`` for the events they never read.
    stream_end_grace_s: Annotated[float, Field(gt=0)] = 10.0
    # Memory bridge: the most bytes of events one run's stream and all of this process's streams
    # retain; over it, the oldest history goes (a ``gap`` to anyone who had not read it).
    stream_run_max_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    stream_max_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    # Ownership: the owner renews its lease every third of this; a run whose lease expired is
    # recovered by a live worker (its assistant's ``on_worker_lost`` policy).
    lease_ttl_s: Annotated[float, Field(ge=1)] = 30.0
    # How often a worker looks for claimable runs when the store cannot wake it across processes
    # (SQLite); with PostgreSQL a NOTIFY wakes it and this is only the safety sweep.
    claim_poll_s: Annotated[float, Field(gt=0)] = 1.0
    worker_max_runs: Annotated[int, Field(ge=1)] = 64  # runs one worker process executes at once
    finalize_step_s: Annotated[float, Field(gt=0)] = 30.0  # bound of each finalization step
    # The most a crash can lose of a run's journal: buffered events are written once the oldest is
    # this old (tool-call intents are written through at once).
    journal_flush_ms: Annotated[int, Field(ge=1, le=60_000)] = 250
    # Concurrent stream subscribers (SSE streams, joins) one process serves; more get 503.
    stream_max_subscribers: PositiveInt = 1000

    loop_detection: LoopDetectionLimits = Field(default_factory=LoopDetectionLimits)
    token_budget: TokenBudgetLimits = Field(default_factory=TokenBudgetLimits)
    turn_limit: TurnLimits = Field(default_factory=TurnLimits)
    tool_progress: ToolProgressLimits = Field(default_factory=ToolProgressLimits)
    tool_output: ToolOutputLimits = Field(default_factory=ToolOutputLimits)
    read_before_write: SwitchLimits = Field(default_factory=SwitchLimits)
    input_sanitization: SwitchLimits = Field(default_factory=SwitchLimits)
    tool_result_sanitization: SanitizationLimits = Field(default_factory=SanitizationLimits)
    llm_retry: LLMRetryLimits = Field(default_factory=LLMRetryLimits)
    request_grammar: RequestGrammarLimits = Field(default_factory=RequestGrammarLimits)
    summarization: SummarizationLimits = Field(default_factory=SummarizationLimits)


__all__ = [
    "FrequencyOverride",
    "LLMRetryLimits",
    "Limits",
    "LoopDetectionLimits",
    "RequestGrammarLimits",
    "SanitizationLimits",
    "SummarizationLimits",
    "SwitchLimits",
    "TokenBudgetLimits",
    "ToolOutputLimits",
    "ToolProgressLimits",
    "TurnLimits",
]
