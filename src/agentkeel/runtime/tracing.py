"""Optional OpenTelemetry traces of runs, their model calls and their tool calls.

Off unless configured, in the OpenTelemetry way: with only ``opentelemetry-api`` installed (the
``otel`` extra) the global tracer provider is a no-op, and so is everything here; a deployment that
installs the SDK and sets a provider (``opentelemetry-instrument keel serve`` with ``OTEL_*``
variables, or ``trace.set_tracer_provider`` in its own entry point) gets the spans. Without the API
package, nothing is imported and nothing happens.

Why from the journal, when the run ends, and not live: the journal already holds every model call
(with its latency) and tool call (with its duration) with the time it was recorded, read once by
the runtime's finished-run hook (``completion_hook``; only when a provider is installed), in
whichever process executed or recovered the run (``keel serve``, ``keel worker``, ``keel run``). Building the spans there gives each span its
recorded start and end (``start_time``/``end_time``), nests them under one run span, and adds no
code to the run's hot path; the cost is that a run's trace appears when the run ends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentkeel.runtime.records import CompletionHook, RunRecord
from agentkeel.runtime.stores.base import JournalEvent, JournalStore

try:
    from opentelemetry import trace
except ImportError:  # the optional extra ``otel`` is not installed
    trace = None  # type: ignore[assignment]

TRACER_NAME = "agentkeel"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def enabled() -> bool:
    """Whether a real tracer provider is installed (the API's default is a proxy to a no-op)."""
    return trace is not None and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def completion_hook(journal: JournalStore) -> CompletionHook:
    """The runtime's completion hook: the finished run's spans, its journal read only when a
    tracer provider is installed."""

    async def traced(record: RunRecord) -> None:
        if enabled():
            emit_run(record, await journal.list(record.run_id))

    return traced


def emit_run(record: RunRecord, events: list[JournalEvent]) -> None:
    """One ``agentkeel.run`` span for the finished run, with a child span per model and tool call."""
    if not enabled() or record.started_at is None:
        return
    tracer = trace.get_tracer(TRACER_NAME)
    end = record.ended_at or record.started_at
    run_span = tracer.start_span("agentkeel.run", start_time=_ns(record.started_at), attributes=_run_attributes(record))
    context = trace.set_span_in_context(run_span)
    for event in events:
        shaped = _call_span(event)
        if shaped is None or event.ts is None:
            continue
        name, took_ms, attributes = shaped
        start = event.ts - timedelta(milliseconds=took_ms)
        span = tracer.start_span(name, context=context, start_time=_ns(start), attributes=attributes)
        if event.data.get("status") == "error":
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end(end_time=_ns(event.ts))
    if record.status.value in ("error", "timeout"):
        run_span.set_status(trace.Status(trace.StatusCode.ERROR, record.error or record.status.value))
    run_span.end(end_time=_ns(end))


def _run_attributes(record: RunRecord) -> dict[str, Any]:
    usage = record.usage or {}
    return {
        "agentkeel.run_id": record.run_id, "agentkeel.thread_id": record.thread_id,
        "agentkeel.assistant_id": record.assistant_id, "agentkeel.attempt": record.attempt,
        "agentkeel.status": record.status.value, "agentkeel.stop_reason": record.stop_reason or "",
        "agentkeel.total_tokens": int(usage.get("total_tokens") or 0),
    }


def _call_span(event: JournalEvent) -> tuple[str, float, dict[str, Any]] | None:
    """(name, duration in ms, attributes) of a model or tool call record; None for other kinds."""
    data = event.data
    common = {"agentkeel.seq": event.seq, "agentkeel.caller": event.caller or ""}
    if event.kind == "model.call":
        return "agentkeel.model_call", float(data.get("latency_ms") or 0), {
            **common, "gen_ai.request.model": str(data.get("model") or ""),
            "gen_ai.usage.input_tokens": int(data.get("input_tokens") or 0),
            "gen_ai.usage.output_tokens": int(data.get("output_tokens") or 0),
        }
    if event.kind == "tool.call":
        return "agentkeel.tool_call", float(data.get("duration_ms") or 0), {
            **common, "agentkeel.tool.name": str(data.get("name") or ""),
            "agentkeel.tool.call_id": str(data.get("call_id") or ""),
            "agentkeel.tool.status": str(data.get("status") or ""),
        }
    return None


def _ns(moment: datetime) -> int:
    """Nanoseconds since the epoch, in integers (a float timestamp loses the microseconds)."""
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000
