"""The Prometheus series of run execution, kept where runs execute, with ``prometheus-client``.

Why here and not in the gateway: a run executes in whichever process claimed it — ``keel serve``,
or a ``keel worker`` with no HTTP API at all — so counting at execution is the only way every run
is counted once, by the process that did the work. The gateway adds its own series (admissions,
streams; ``gateway/metrics.py``) on top of these; ``keel worker --metrics-port`` serves these alone.

Each ``RunMetrics`` owns its own ``CollectorRegistry`` rather than the library's global one: a test
process opens many runtimes, and a second one must not collide with, or read, the first one's.

*Events* are counted when they happen: every journal record of the runs this process executes
passes through :meth:`RunMetrics.journaled` as it is recorded, so a model call's tokens and a guard
intervention count at once, mid-run, and exactly once (the run's end reads nothing back). A
finished run is counted by status and primary stop reason (a completion hook, also called by
recovery for a lost run it ends); a recovery by its policy and outcome. *Levels* are read at scrape
time: runs executing here and stream publishes lost to backend faults. Nothing is durable: a
restart starts at zero, as Prometheus expects; the store holds the totals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentkeel.runtime.records import TERMINAL_STATUSES, RunRecord
from agentkeel.runtime.stores.base import JournalEvent

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NO_STOP_REASON = "none"  # the label of a run that stopped for no recorded reason (a clean success)
RESUMED = "resumed"  # the outcome of a recovery that continues the run (``on_worker_lost: resume``)


class RunMetrics(Collector):
    """This process's run counters since it started. A ``Collector`` itself, so a gateway can
    register it in its own registry next to its series (one exposition, one scrape)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._in_flight: Callable[[], int] = lambda: 0
        self._publish_failures: Callable[[], int] = lambda: 0
        r = self.registry
        self.runs_finished = Counter(
            "agentkeel_runs_finished", "Runs this process finished, by terminal status and primary stop reason.",
            ["status", "stop_reason"], registry=r,
        )
        for status in sorted(TERMINAL_STATUSES):  # present from the start, so rate() sees the first run
            self.runs_finished.labels(status.value, NO_STOP_REASON)
        self.tokens = Counter(
            "agentkeel_tokens", "Tokens of the model calls this process made for runs, by caller and model.",
            ["caller", "model", "direction"], registry=r,
        )
        self.interventions = Counter(
            "agentkeel_guard_interventions", "Guard interventions in runs this process executed.",
            ["middleware", "action"], registry=r,
        )
        self.recoveries = Counter(
            "agentkeel_lease_recoveries", "Lost runs (owner dead or lease expired) this process took over, "
            "by on_worker_lost policy and outcome (resumed, or the status recovery ended the run with).",
            ["policy", "outcome"], registry=r,
        )
        r.register(_Levels(self))

    def bind(self, in_flight: Callable[[], int], publish_failures: Callable[[], int]) -> None:
        """Where the scrape-time levels are read: the run manager and the stream bridge."""
        self._in_flight = in_flight
        self._publish_failures = publish_failures

    # -- events --------------------------------------------------------------------------------
    def journaled(self, event: JournalEvent) -> None:
        """A journal observer: called once per record of a run executing here, as it is recorded
        (possibly from a LangChain callback thread; the counters are thread-safe)."""
        data = event.data
        if event.kind == "model.call":
            caller, model = event.caller or "unknown", str(data.get("model") or "unknown")
            self.tokens.labels(caller, model, "input").inc(_count(data.get("input_tokens")))
            self.tokens.labels(caller, model, "output").inc(_count(data.get("output_tokens")))
        elif event.kind == "intervention":
            self.interventions.labels(str(data.get("middleware") or "unknown"), str(data.get("action") or "unknown")).inc()

    async def finished(self, record: RunRecord) -> None:
        """A completion hook: the run ended here (executed, or ended by recovery)."""
        self.runs_finished.labels(record.status.value, record.stop_reason or NO_STOP_REASON).inc()

    def recovered(self, policy: str, outcome: str) -> None:
        """A lost run was taken over: ``outcome`` is ``resumed`` or the status it was ended with."""
        self.recoveries.labels(policy, outcome).inc()

    # -- exposition ----------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _count(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


class _Levels(Collector):
    """Values read from the process at scrape time: nothing to increment, nothing to drift."""

    def __init__(self, metrics: RunMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        yield GaugeMetricFamily("agentkeel_runs_active", "Runs executing in this process now.", value=m._in_flight())
        yield CounterMetricFamily(
            "agentkeel_stream_publish_failures",
            "Stream publishes (END included) lost to stream backend faults; runs go on.",
            value=m._publish_failures(),
        )


__all__ = ["CONTENT_TYPE", "NO_STOP_REASON", "RESUMED", "RunMetrics"]
