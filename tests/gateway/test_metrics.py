"""``/metrics`` of a real ``keel serve``: it parses with prometheus_client's own text parser, and
its series move as a run executes (admitted, active, subscribed, finished with its stop reason,
its tokens by caller and model, its guard interventions). And the optional OpenTelemetry spans of
a finished run, caught by the SDK's in-memory exporter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from console_support import write_console_project
from prometheus_client.parser import text_string_to_metric_families
from server_support import KeelServer, start_server

from agentkeel.runtime import tracing
from agentkeel.runtime.records import RunRecord, RunStatus, utcnow
from agentkeel.runtime.stores.base import JournalEvent

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    running = start_server(write_console_project(tmp_path_factory.mktemp("keel-metrics")))
    yield running
    running.stop()


def scrape(server: KeelServer) -> Samples:
    answer = httpx.get(f"{server.url}/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


def test_metrics_parse_and_move_as_a_run_executes(server: KeelServer) -> None:
    before = scrape(server)
    families = {family.name: family.type for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)}
    assert families["agentkeel_admission_seconds"] == "histogram"
    assert families["agentkeel_runs_finished"] == families["agentkeel_tokens"] == "counter"
    assert families["agentkeel_runs_active"] == families["agentkeel_stream_subscribers"] == "gauge"
    assert value(before, "agentkeel_runs_active") == 0

    thread = httpx.post(f"{server.url}/threads", json={}).json()["thread_id"]
    run = httpx.post(f"{server.url}/threads/{thread}/runs",
                     json={"assistant_id": "lead", "input": "write", "context": {"model_name": "console"}}).json()
    during = wait_for(lambda: (s := scrape(server)) and value(s, "agentkeel_runs_active") == 1 and s)
    assert value(during, "agentkeel_runs_created_total") == value(before, "agentkeel_runs_created_total") + 1
    assert value(during, "agentkeel_admission_seconds_count") == value(before, "agentkeel_admission_seconds_count") + 1
    assert value(during, "agentkeel_admission_seconds_sum") > value(before, "agentkeel_admission_seconds_sum")
    with httpx.stream("GET", f"{server.url}/threads/{thread}/runs/{run['run_id']}/stream", timeout=30) as stream:
        lines = stream.iter_lines()
        next(lines)  # the stream is open: its subscription is counted while it follows the run
        wait_for(lambda: value(scrape(server), "agentkeel_stream_subscribers") >= 1)
        assert value(scrape(server), "agentkeel_streams_open") >= 1
        for _line in lines:  # until the server closes it after END
            pass

    record = wait_for(lambda: (r := httpx.get(f"{server.url}/threads/{thread}/runs/{run['run_id']}").json())["status"] == "success" and r)
    after = wait_for(lambda: (s := scrape(server)) and value(s, "agentkeel_runs_active") == 0 and s)
    capped = {"status": "success", "stop_reason": "token_capped"}
    assert record["stop_reason"] == "token_capped"
    assert value(after, "agentkeel_runs_finished_total", **capped) == value(before, "agentkeel_runs_finished_total", **capped) + 1
    assert value(after, "agentkeel_stream_subscribers") == 0
    by_agent = record["usage"]["by_agent"]  # keyed by the full caller, as the journal records it
    for caller in ("lead", "subagent:general-purpose"):
        for direction in ("input", "output"):
            labels = {"caller": caller, "model": "console", "direction": direction}
            moved = value(after, "agentkeel_tokens_total", **labels) - value(before, "agentkeel_tokens_total", **labels)
            assert moved == by_agent[caller][f"{direction}_tokens"], (caller, direction)
    withheld = {"middleware": "TokenBudget", "action": "withhold"}
    assert value(after, "agentkeel_guard_interventions_total", **withheld) == value(before, "agentkeel_guard_interventions_total", **withheld) + 1
    assert value(after, "agentkeel_stream_events_sent_total") > value(before, "agentkeel_stream_events_sent_total")


def test_a_finished_run_becomes_spans_when_a_provider_is_set() -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not tracing.enabled()  # the API's default provider: nothing is emitted
    trace.set_tracer_provider(provider)
    assert tracing.enabled()

    start = utcnow()
    record = RunRecord("run-1", "thread-1", "lead", status=RunStatus.error, started_at=start,
                       ended_at=start + timedelta(seconds=3), error="ValueError: boom", stop_reasons=[])
    events = [
        JournalEvent("run-1", "thread-1", 1, "run.start", {}, "worker", start),
        JournalEvent("run-1", "thread-1", 2, "model.call", {"model": "gpt", "input_tokens": 120, "output_tokens": 7,
                                                            "latency_ms": 800}, "lead", start + timedelta(seconds=1)),
        JournalEvent("run-1", "thread-1", 3, "tool.call", {"name": "write_file", "call_id": "c1", "status": "error",
                                                           "duration_ms": 250}, "lead", start + timedelta(seconds=2)),
    ]
    tracing.emit_run(record, events)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"agentkeel.run", "agentkeel.model_call", "agentkeel.tool_call"}
    run, model, tool = spans["agentkeel.run"], spans["agentkeel.model_call"], spans["agentkeel.tool_call"]
    assert model.parent.span_id == run.context.span_id and tool.parent.span_id == run.context.span_id
    assert (model.end_time - model.start_time) == 800_000_000 and (tool.end_time - tool.start_time) == 250_000_000
    assert run.end_time - run.start_time == 3_000_000_000
    assert model.attributes["gen_ai.usage.input_tokens"] == 120 and tool.attributes["agentkeel.tool.name"] == "write_file"
    assert run.status.status_code.name == "ERROR" and tool.status.status_code.name == "ERROR"
    assert run.attributes["agentkeel.run_id"] == "run-1"
