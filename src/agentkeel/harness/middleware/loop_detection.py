"""LoopDetection: stop an agent that keeps asking for the same tool calls (``loop_capped``).

Why: a degenerate agent repeats one tool-call set, or hammers one tool with drifting arguments,
until something outside stops it (DeerFlow #3875 burned ~4.4M tokens that way). Two layers run on
every response, over the calls the model *intended* (:func:`intended_calls`: calls another guard
withheld still count, calls a protocol repair suppressed do not), so the verdict does not depend on
where this guard sits relative to the other guards:

* **call-set hash** — the response's calls, canonicalised and order-free, hashed; counted over the
  last ``window_size`` tool-calling responses. ``warn_threshold`` repeats queue a warning once per
  hash, ``hard_limit`` repeats stop.
* **per-tool frequency** — every call of every response, counted over a sliding window of the last
  ``max(window_size, tool_freq_hard_limit, override hard limits)`` calls, so counts decay and a long
  healthy run never trips. No early return: all calls of a response are counted before judging.

A ``read_file`` counts as the same call only while the file is unchanged: its key carries the hash of
the file at the newest read of that path (the read-before-write mark). Re-reading a file after each
edit — which the read-before-write gate requires — is progress, not a loop.

Warnings go to the *next* request as one transient ``loop_warning`` note (never into state, so an
AIMessage with tool calls stays directly followed by its ToolMessages). A hard stop withholds the
response's calls and records ``loop_capped`` once per run; later responses that still hit a limit are
withheld again silently.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain.agents.middleware.types import ModelRequest, ModelResponse

from agentkeel.harness.middleware.base import HintQueue, KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.keys import READ_MARK
from agentkeel.harness.middleware.responses import intended_calls, last_ai, replace_ai, withhold
from agentkeel.limits import LoopDetectionLimits
from agentkeel.sandbox.workspace import to_relpath, to_virtual

READ_BUCKET_LINES = 200
"""``read_file`` ranges within the same 200-line buckets count as the same read."""


def _parse_json_strings(value: Any) -> Any:
    """``value`` with strings that hold a JSON object or array replaced by the parsed data."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return _parse_json_strings(parsed) if isinstance(parsed, dict | list) else value
    if isinstance(value, Mapping):
        return {str(k): _parse_json_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_parse_json_strings(v) for v in value]
    return value


def _read_key(args: Mapping[str, Any]) -> str | None:
    """``path:startBucket-endBucket`` for a ``read_file`` call, or None if the lines are not ints."""
    try:
        start = int(args.get("start_line") or 1)
        end = None if args.get("end_line") is None else int(args["end_line"])
    except (TypeError, ValueError):
        return None
    if end is not None and end < start:
        start, end = end, start
    first = (max(start, 1) - 1) // READ_BUCKET_LINES
    last = "eof" if end is None else str((max(end, 1) - 1) // READ_BUCKET_LINES)
    return f"{args.get('path')}:{first}-{last}"


def virtual_path(path: Any) -> str:
    """``notes/a.md`` and ``/workspace/./notes/a.md`` as one ``/workspace/notes/a.md`` (anything
    outside the workspace keeps its own spelling: it is only a key)."""
    text = str(path or "")
    rel = to_relpath(text)
    return text if rel is None else to_virtual(rel)


def read_versions(messages: Sequence[Any]) -> dict[str, str]:
    """Path -> file hash at the newest ``read_file`` of it, from the read marks in ``messages``."""
    versions: dict[str, str] = {}
    for message in messages:
        mark = (getattr(message, "additional_kwargs", None) or {}).get(READ_MARK)
        if isinstance(mark, Mapping) and mark.get("path"):
            versions[virtual_path(mark["path"])] = str(mark.get("sha256", ""))
    return versions


def call_key(call: Mapping[str, Any], versions: Mapping[str, str] | None = None) -> str:
    """One call as ``name:canonical args`` (sorted-key JSON; ``read_file`` by path, line buckets
    and the file's version at its newest read)."""
    name = str(call.get("name") or "")
    args = _parse_json_strings(call.get("args") or {})
    if name == "read_file" and isinstance(args, Mapping):
        key = _read_key(args)
        if key is not None:
            version = (versions or {}).get(virtual_path(args.get("path")), "")
            return f"{name}:{key}@{version}"
    return f"{name}:{json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)}"


def call_set_hash(calls: Sequence[Mapping[str, Any]], versions: Mapping[str, str] | None = None) -> str:
    """A short digest of a response's calls that ignores their order."""
    entries = sorted(call_key(c, versions) for c in calls)
    return hashlib.sha256(json.dumps(entries, ensure_ascii=False).encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True)
class Trip:
    """One hard limit reached: ``key`` is the call-set hash or the tool name."""

    layer: Literal["hash", "frequency"]
    key: str
    count: int
    threshold: int


@dataclass
class Verdict:
    warnings: list[str] = field(default_factory=list)
    trips: list[Trip] = field(default_factory=list)


class LoopTracker:
    """The two windows of one agent run and their thresholds (no LangChain, unit-testable)."""

    def __init__(self, limits: LoopDetectionLimits) -> None:
        self.limits = limits
        overrides = [o.hard_limit for o in limits.tool_freq_overrides.values()]
        self.freq_window = max(limits.window_size, limits.tool_freq_hard_limit, *overrides)
        self._hashes: deque[str] = deque(maxlen=limits.window_size)
        self._warned_hashes: set[str] = set()
        self._calls: deque[str] = deque(maxlen=self.freq_window)
        self._warned_tools: set[str] = set()

    def thresholds(self, tool: str) -> tuple[int, int]:
        """(warn, hard) for ``tool``: its override, else the global frequency limits."""
        override = self.limits.tool_freq_overrides.get(tool)
        if override is not None:
            return override.warn, override.hard_limit
        return self.limits.tool_freq_warn, self.limits.tool_freq_hard_limit

    def observe(self, calls: Sequence[Mapping[str, Any]], versions: Mapping[str, str] | None = None) -> Verdict:
        """Count one response's calls in both layers and say what fired."""
        verdict = Verdict()
        if calls:
            self._observe_hash(call_set_hash(calls, versions), verdict)
            self._observe_frequency([str(c.get("name") or "") for c in calls], verdict)
        return verdict

    def _observe_hash(self, digest: str, verdict: Verdict) -> None:
        self._hashes.append(digest)
        self._warned_hashes &= set(self._hashes)
        count = self._hashes.count(digest)
        if count >= self.limits.hard_limit:
            verdict.trips.append(Trip("hash", digest, count, self.limits.hard_limit))
        elif count >= self.limits.warn_threshold and digest not in self._warned_hashes:
            self._warned_hashes.add(digest)
            verdict.warnings.append(
                "[LOOP DETECTED] You are repeating the same tool calls "
                f"({count} times in the last {len(self._hashes)} tool-calling turns). Do not call them "
                "again: use the results you already have and give your final answer now."
            )

    def _observe_frequency(self, names: list[str], verdict: Verdict) -> None:
        self._calls.extend(names)
        counts = Counter(self._calls)
        self._warned_tools = {t for t in self._warned_tools if counts[t] >= self.thresholds(t)[0]}
        for tool in dict.fromkeys(names):
            warn, hard = self.thresholds(tool)
            count = counts[tool]
            if count >= hard:
                verdict.trips.append(Trip("frequency", tool, count, hard))
            elif count >= warn and tool not in self._warned_tools:
                self._warned_tools.add(tool)
                verdict.warnings.append(
                    f"[LOOP DETECTED] You have called {tool} {count} times in the last "
                    f"{len(self._calls)} tool calls without finishing. Stop calling {tool} unless it "
                    "is essential and work towards your final answer."
                )


def _describe(trip: Trip) -> str:
    if trip.layer == "hash":
        return f"the same tool calls were requested {trip.count} times (limit {trip.threshold})"
    return f"{trip.key} was called {trip.count} times in the recent window (limit {trip.threshold})"


class LoopDetection(KeelMiddleware):
    """Warns on, then stops, repeated tool calls; see the module docstring."""

    contract = Contract(
        axes={"model": on(
            reads={"model_response.tool_calls"},
            observes_final={"model_response.tool_calls"},
            mutates={"model_response.dispatch", "model_request.messages"},
        )},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self, limits: LoopDetectionLimits) -> None:
        super().__init__()
        self.limits = limits
        self.tracker = LoopTracker(limits)
        self._hints = HintQueue("loop_warning")
        self._capped = False

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        outgoing, sent = self._hints.apply(request)
        response = await handler(outgoing)
        self._hints.delivered(sent)

        ai = last_ai(response)
        if ai is None:
            return response
        verdict = self.tracker.observe(intended_calls(ai), read_versions(request.messages))
        runtime = request.runtime
        if not verdict.trips:
            for text in verdict.warnings:
                self._hints.push(text)
                self.intervene(runtime, "warn", text, message_id=ai.id)
            return response

        reasons = "; ".join(_describe(t) for t in verdict.trips)
        note = f"[LOOP STOPPED] These tool calls were not run: {reasons}. Answer with what you have."
        if not self._capped:
            self._capped = True
            first = verdict.trips[0]
            data: dict[str, Any] = {"layer": first.layer, "count": first.count, "threshold": first.threshold}
            data["hash" if first.layer == "hash" else "tool"] = first.key
            await self.stop(runtime, "loop_capped", f"Tool calls withheld: {reasons}.", data, cause=ai.id)
        self.intervene(runtime, "withhold", note, message_id=ai.id)
        return replace_ai(response, ai, withhold(ai, self.name, note))


__all__ = ["LoopDetection", "LoopTracker", "Trip", "Verdict", "call_key", "call_set_hash", "read_versions"]
