"""The script file format of the scripted model, its loader and its templating.

The format is a public interface (``shared/spec/scripted-model.md``, ``docs/scripted-model.md``):
users write these files by hand, so every key is checked, unknown keys are refused rather than
silently ignored, and each problem is reported as ``file: agents.<name>[<entry>].<field>: why``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    model_validator,
)

from agentkeel.harness.scripted.errors import ScriptError

FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "refusal", "SAFETY"]
Provider = Literal["openai", "anthropic", "gemini"]
ErrorKind = Literal["rate_limit", "server_error", "bad_request", "timeout"]

FALLBACK_ERROR = "error"
"""The ``fallback`` value that turns an exhausted agent into a failure instead of a reply."""


def _int_or_keyword(keyword: str, minimum: int) -> PlainValidator:
    """A validator for "a number, or this one word", reporting one readable error.

    A plain ``int | Literal[...]`` union would report one error per union member, with loc parts
    such as ``literal['auto']`` that mean nothing to someone editing a YAML file.
    """

    def check(value: object) -> int | str:
        if value == keyword:
            return keyword
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        raise ValueError(f"must be an integer >= {minimum} or {keyword!r} (got {value!r})")

    return PlainValidator(check)


TokenCount = Annotated[int | Literal["auto"], _int_or_keyword("auto", 0)]
Repeat = Annotated[int | Literal["forever"], _int_or_keyword("forever", 1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _json_data(args: dict[str, Any]) -> dict[str, Any]:
    # Arguments travel as JSON text when streamed; YAML dates and the like would not survive that.
    try:
        json.dumps(args)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be plain JSON data; quote dates and other special YAML values ({exc})") from None
    return args


class ToolCallSpec(_Strict):
    name: str = Field(min_length=1)
    args: Annotated[dict[str, Any], AfterValidator(_json_data)] = Field(default_factory=dict)
    # The argument text exactly as a provider would send it, valid JSON or not (a truncated or
    # broken string reproduces what real models sometimes emit).
    raw_args: str | None = None
    id: str | None = None

    @model_validator(mode="after")
    def _one_kind_of_args(self) -> ToolCallSpec:
        if self.raw_args is not None and "args" in self.model_fields_set:
            raise ValueError("give either `args` or `raw_args`, not both")
        return self


class UsageSpec(_Strict):
    input: TokenCount = "auto"
    output: TokenCount = "auto"


class RaiseSpec(_Strict):
    kind: ErrorKind
    message: str | None = None


class ExpectSpec(_Strict):
    contains: str = Field(min_length=1)


_ANSWER_FIELDS = ("say", "tool_calls", "usage", "finish_reason", "stream_chunks")


class Turn(_Strict):
    """One scripted model response (or failure); ``repeat`` makes it play several times."""

    say: str | None = None
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    usage: UsageSpec = Field(default_factory=UsageSpec)
    finish_reason: FinishReason | None = None
    provider: Provider = "openai"
    stream_chunks: int = Field(default=1, ge=1)
    delay_ms: float = Field(default=0, ge=0)
    repeat: Repeat = 1
    raise_: RaiseSpec | None = Field(default=None, alias="raise")
    expect: ExpectSpec | None = None

    @model_validator(mode="after")
    def _raise_replaces_answer(self) -> Turn:
        # An answer next to `raise` would never be seen; refusing it keeps scripts honest.
        clashing = [name for name in _ANSWER_FIELDS if name in self.model_fields_set]
        if self.raise_ is not None and clashing:
            raise ValueError(f"`raise` replaces the answer, so it cannot be combined with: {', '.join(clashing)}")
        return self


def _reachable(turns: list[Turn]) -> list[Turn]:
    for index, turn in enumerate(turns[:-1]):
        if turn.repeat == "forever":
            raise ValueError(f"entry [{index + 1}] can never play: entry [{index}] has `repeat: forever`")
    return turns


_INSTANCE_KEY = re.compile(r"[^#@]+#(0|[1-9][0-9]{0,5})")
_TASK_KEY = re.compile(r"[^#@]+@[^#@]+")


def _agent_key(key: str) -> str:
    """An agent name, ``<name>#<instance>`` (one instance's own list) or ``<name>@<task id>`` (the
    list of the subagent serving that task: what ``keel replay --export`` writes, since two
    children of one type answered differently and their instance numbers follow the scheduler)."""
    if "@" in key and not _TASK_KEY.fullmatch(key):
        raise ValueError(f"agent key {key!r}: a task key is <name>@<task id>, e.g. researcher@call_1")
    if "#" in key and not _INSTANCE_KEY.fullmatch(key):
        raise ValueError(f"agent key {key!r}: an instance key is <name>#<instance number>, e.g. researcher#0")
    return key


class Script(_Strict):
    """A whole script: per-agent turn lists plus the settings that apply to every agent."""

    strict: bool = True
    fallback: str = "Done."
    agents: dict[Annotated[str, Field(min_length=1), AfterValidator(_agent_key)],
                 Annotated[list[Turn], AfterValidator(_reachable)]] = Field(default_factory=dict)

    def turns_for(self, agent: str, instance: int | None = None, task: str | None = None) -> list[Turn]:
        """The task's list (``<agent>@<task>``), else the instance's (``<agent>#<instance>``), else
        the agent's, else the ``"*"`` list, else nothing (every call falls back)."""
        if task is not None and f"{agent}@{task}" in self.agents:
            return self.agents[f"{agent}@{task}"]
        if instance is not None and f"{agent}#{instance}" in self.agents:
            return self.agents[f"{agent}#{instance}"]
        if agent in self.agents:
            return self.agents[agent]
        return self.agents.get("*", [])

    def step(self, agent: str, turn: int, instance: int | None = None, task: str | None = None) -> Turn | None:
        """The entry that plays the ``turn``-th call (1-based) of the agent (of its ``instance``,
        serving ``task``), or ``None`` once exhausted."""
        remaining = turn - 1
        for entry in self.turns_for(agent, instance, task):
            if entry.repeat == "forever" or remaining < entry.repeat:
                return entry
            remaining -= entry.repeat
        return None


def parse_script(data: object, source: str = "<script>") -> Script:
    """Validate already-parsed script data; ``source`` names it in error messages."""
    if not isinstance(data, Mapping):
        raise ScriptError(f"{source}: a script must be a mapping with an `agents` key (got {type(data).__name__})")
    try:
        return Script.model_validate(data)
    except ValidationError as exc:
        problems = [f"{source}: {_location(error['loc'])}: {_reason(error)}" for error in exc.errors()]
        raise ScriptError("\n".join(problems)) from None


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read a YAML or JSON (by ``.json`` suffix) script file. Resolving relative paths is the caller's job."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"{source}: cannot read the script: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ScriptError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from exc
    return parse_script(data, source)


def _location(loc: tuple[int | str, ...]) -> str:
    """``('agents', 'lead', 3, 'finish_reason')`` -> ``agents.lead[3].finish_reason``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for a problem with a mapping key itself
            text += " (key)"
        else:
            text += ("." if text else "") + (part or '""')
    return text or "(top level)"


def _reason(error: Any) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "literal_error":
        return f"must be one of {ctx['expected']} (got {error['input']!r})"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "is required"
    if kind == "value_error":
        return str(ctx["error"])
    return f"{error['msg']} (got {error['input']!r})"


_PLACEHOLDER = re.compile(r"\{(turn|agent|instance)\}")


def render(value: Any, values: Mapping[str, str]) -> Any:
    """Replace ``{turn}``, ``{agent}``, ``{instance}`` in every string inside ``value``.

    Only those three exact placeholders are touched, so JSON text, code and other braces in a
    script survive untouched (``str.format`` would choke on them).
    """
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda match: values[match.group(1)], value)
    if isinstance(value, list):
        return [render(item, values) for item in value]
    if isinstance(value, dict):
        return {render(key, values): render(item, values) for key, item in value.items()}
    return value
