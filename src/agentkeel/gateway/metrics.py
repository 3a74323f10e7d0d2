"""The gateway process's Prometheus metrics (``GET /metrics``), kept with ``prometheus-client``.

Each ``Metrics`` owns its own ``CollectorRegistry`` rather than the library's global one: a test
process builds many apps, and a second app must not collide with, or read, the first one's series.

Two kinds of series. *Events* are counted when they happen: a run admitted (with how long the
admission transaction took, a histogram), and a run finished in this process (the runtime's
completion hook) — by status and primary stop reason, and, from the run's journal read once at
that moment, its tokens by caller and model, its guard interventions and its lease recoveries.
*Levels* are read when scraped (``_Levels``): runs executing here, stream subscribers, open SSE
streams, events sent, publish failures, draining. Nothing here is durable: the store holds the
totals (``keel runs list``); a restart starts the counters at zero, as Prometheus expects.

The finished-run hook also hands the journal it read to the optional tracer (``tracing``), so an
OpenTelemetry deployment costs no second read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentkeel.gateway import tracing
from agentkeel.runtime.records import TERMINAL_STATUSES, RunRecord

if TYPE_CHECKING:
    from agentkeel.runtime.runtime import Runtime

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NO_STOP_REASON = "none"  # the label of a run that stopped for no recorded reason (a clean success)
# Admission is one store transaction: sub-millisecond on SQLite, a few ms on a busy PostgreSQL.
ADMISSION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """This process's counters since it started; the integer attributes are the ones the stream
    routes move directly (``streams_open``, ``stream_events_sent``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.streams_open = 0
        self.stream_events_sent = 0
        self.runtime: Runtime | None = None
        self._draining: Callable[[], bool] = lambda: False
        r = self.registry
        self.runs_created = Counter("agentkeel_runs_created", "Runs admitted through this gateway process.", registry=r)
        self.admission_seconds = Histogram(
            "agentkeel_admission_seconds", "Time to admit a run (checks done, the admission transaction and the strategy).",
            buckets=ADMISSION_BUCKETS, registry=r,
        )
        self.runs_finished = Counter(
            "agentkeel_runs_finished", "Runs this process finished, by terminal status and primary stop reason.",
            ["status", "stop_reason"], registry=r,
        )
        for status in sorted(TERMINAL_STATUSES):  # present from the start, so rate() sees the first run
            self.runs_finished.labels(status.value, NO_STOP_REASON)
        self.tokens = Counter(
            "agentkeel_tokens", "Tokens of the model calls of runs this process finished, by caller and model.",
            ["caller", "model", "direction"], registry=r,
        )
        self.interventions = Counter(
            "agentkeel_guard_interventions", "Guard interventions in runs this process finished.",
            ["middleware", "action"], registry=r,
        )
        self.recoveries = Counter(
            "agentkeel_lease_recoveries", "Lease recoveries (a lost owner's run taken over) in runs this process finished.",
            ["policy"], registry=r,
        )
        r.register(_Levels(self))

    def bind(self, runtime: Runtime, draining: Callable[[], bool]) -> None:
        """The runtime whose levels are scraped and whose journal the finished-run hook reads,
        and how to tell that the gateway drains."""
        self.runtime = runtime
        self._draining = draining

    @property
    def draining(self) -> bool:
        return self._draining()

    def admitted(self, seconds: float) -> None:
        self.runs_created.inc()
        self.admission_seconds.observe(seconds)

    async def on_run_finished(self, record: RunRecord) -> None:
        """A runtime completion hook: count the run, then what its journal says it did."""
        self.runs_finished.labels(record.status.value, record.stop_reason or NO_STOP_REASON).inc()
        if self.runtime is None:
            return
        events = await self.runtime.journal.list(record.run_id)
        for event in events:
            data = event.data
            if event.kind == "model.call":
                caller, model = event.caller or "unknown", str(data.get("model") or "unknown")
                self.tokens.labels(caller, model, "input").inc(_count(data.get("input_tokens")))
                self.tokens.labels(caller, model, "output").inc(_count(data.get("output_tokens")))
            elif event.kind == "intervention":
                self.interventions.labels(str(data.get("middleware") or "unknown"), str(data.get("action") or "unknown")).inc()
            elif event.kind == "run.recovered":
                self.recoveries.labels(str(data.get("policy") or "unknown")).inc()
        tracing.emit_run(record, events)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _count(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


class _Levels(Collector):
    """Values read from the process at scrape time: nothing to increment, nothing to drift."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        runtime = m.runtime
        yield _gauge("agentkeel_runs_active", "Runs executing in this process now.",
                     runtime.manager.in_flight if runtime else 0)
        yield _gauge("agentkeel_stream_subscribers", "Stream subscriptions this process serves.",
                     runtime.bridge.subscribers if runtime else 0)
        yield _gauge("agentkeel_streams_open", "Open SSE streams (run and thread streams).", m.streams_open)
        yield _gauge("agentkeel_draining", "1 while the gateway drains for shutdown.", int(m.draining))
        yield CounterMetricFamily("agentkeel_stream_events_sent", "Run events sent over SSE.", value=m.stream_events_sent)
        yield CounterMetricFamily(
            "agentkeel_stream_publish_failures",
            "Stream publishes (END included) lost to stream backend faults; runs go on.",
            value=runtime.bridge.publish_failures if runtime else 0,
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
