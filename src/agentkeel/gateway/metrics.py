"""The gateway process's Prometheus metrics (``GET /metrics``), kept with ``prometheus-client``.

Each ``Metrics`` owns its own ``CollectorRegistry`` rather than the library's global one: a test
process builds many apps, and a second app must not collide with, or read, the first one's series.

The run series (runs finished, tokens, guard interventions, lease recoveries, runs active) are the
runtime's (``runtime/metrics.py``): counted where runs execute, so a ``keel worker`` exports the
same ones, and registered here as one collector. What only a gateway knows is counted here:
admissions (with how long the admission transaction took, a histogram) and, read when scraped,
stream subscribers, open SSE streams, events sent, draining — and the shared store's live runs by
status (``agentkeel_store_runs``), which is what a ``keel serve --no-worker`` can say about runs it
does not execute: one indexed count per scrape, bounded by ``STORE_COUNT_TIMEOUT_S``.

Nothing here is durable: a restart starts the counters at zero, as Prometheus expects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentkeel.runtime.metrics import CONTENT_TYPE
from agentkeel.runtime.records import RunStatus

if TYPE_CHECKING:
    from agentkeel.runtime.runtime import Runtime

log = logging.getLogger(__name__)

# Admission is one store transaction: sub-millisecond on SQLite, a few ms on a busy PostgreSQL.
ADMISSION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# The store's live runs: the queue bounds these rows; terminal totals grow without bound (and are
# the workers' ``agentkeel_runs_finished_total``), so they are not counted at scrape time.
STORE_STATUSES = (RunStatus.pending, RunStatus.running)
STORE_COUNT_TIMEOUT_S = 2.0  # past this a scrape answers without ``agentkeel_store_runs``


class Metrics:
    """This gateway's counters since it started; the integer attributes are the ones the stream
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
        r.register(_Levels(self))

    def bind(self, runtime: Runtime, draining: Callable[[], bool]) -> None:
        """The runtime whose run series are exported with ours and whose levels are scraped, and
        how to tell that the gateway drains."""
        if self.runtime is None:
            self.registry.register(runtime.metrics)
        self.runtime = runtime
        self._draining = draining

    @property
    def draining(self) -> bool:
        return self._draining()

    def admitted(self, seconds: float) -> None:
        self.runs_created.inc()
        self.admission_seconds.observe(seconds)

    async def exposition(self) -> bytes:
        """The text exposition, with the store's live runs read for this scrape (a store that
        does not answer in time leaves that series out, never the scrape)."""
        return generate_latest(_Scrape(self.registry, await self._store_runs()))

    async def _store_runs(self) -> list[Metric]:
        if self.runtime is None:
            return []
        try:
            counts = await asyncio.wait_for(self.runtime.store.count_runs(list(STORE_STATUSES)), STORE_COUNT_TIMEOUT_S)
        except Exception as exc:
            log.warning("/metrics: counting the store's runs failed: %r", exc)
            return []
        family = GaugeMetricFamily(
            "agentkeel_store_runs", "Live runs in the shared store by status, wherever they execute "
            "(every gateway of a deployment reports the same figures).", labels=["status"],
        )
        for status, count in counts.items():
            family.add_metric([status.value], count)
        return [family]


class _Scrape(Collector):
    """One scrape: the registry's series and those read for this scrape alone (concurrent
    scrapes share nothing)."""

    def __init__(self, registry: CollectorRegistry, extra: list[Metric]) -> None:
        self._registry = registry
        self._extra = extra

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        yield from self._extra


class _Levels(Collector):
    """Values read from the process at scrape time: nothing to increment, nothing to drift."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        runtime = m.runtime
        yield _gauge("agentkeel_stream_subscribers", "Stream subscriptions this process serves.",
                     runtime.bridge.subscribers if runtime else 0)
        yield _gauge("agentkeel_streams_open", "Open SSE streams (run and thread streams).", m.streams_open)
        yield _gauge("agentkeel_draining", "1 while the gateway drains for shutdown.", int(m.draining))
        yield CounterMetricFamily("agentkeel_stream_events_sent", "Run events sent over SSE.", value=m.stream_events_sent)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


__all__ = ["CONTENT_TYPE", "Metrics"]
