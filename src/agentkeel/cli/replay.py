"""``keel replay RUN_ID``: a run's aligned timeline in the terminal, its export, re-run and forks.

The timeline is built as data by ``runtime/timeline.py`` (checked by ``runtime/divergence.py``);
this module only draws it: one line per journal record, checkpoint and run of stream events, on
the journal's seq axis, a subagent's records indented under its task call, the divergences last.
``--export FILE`` writes the run as a scripted-model file (``runtime/script_export.py``);
``--rerun`` plays it offline — model answers and tool results from the recording
(``runtime/tool_replay.py``; ``--live-tools`` runs the tools again), on a new thread set up as the
run's was when it began (``runtime/replay_thread.py``), and compares (``runtime/replay.py``),
naming what it cannot reproduce; ``--fork-at STEP`` continues
the thread from that checkpoint with ``--model`` (a model of the config) or ``--script``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentkeel.cli.event_loop import run_async
from agentkeel.config import KeelConfig, ModelConfig
from agentkeel.harness.agents import Harness
from agentkeel.runtime.records import RunRecord, RunStatus
from agentkeel.runtime.replay import ReplayError, RerunReport, fork, offline_config, replay_and_compare
from agentkeel.runtime.runtime import open_runtime
from agentkeel.runtime.script_export import ExportError, export_script
from agentkeel.runtime.timeline import Item, Timeline, load_timeline
from agentkeel.runtime.tool_replay import RecordedTools

FORK_SCRIPT_MODEL = "replay-script"


class ReplayCommandError(Exception):
    """A message for the user and the exit code (``keel replay`` prints it and exits)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def replay(config: KeelConfig, harness: Harness, run_id: str, *, console: Console, as_json: bool = False,
           export: Path | None = None, do_rerun: bool = False, fork_at: int | None = None,
           model: str | None = None, script: Path | None = None, live_tools: bool = False) -> int:
    """Everything ``keel replay`` does; the exit code (raises ``ReplayCommandError``)."""
    timeline, events_script = run_async(_read(config, harness, run_id, export is not None or do_rerun))
    if as_json:
        print(json.dumps(timeline.to_dict(), indent=2, default=str))
    else:
        render_timeline(console, timeline)
    if export is not None:
        export.write_text(yaml.safe_dump(events_script, sort_keys=False, allow_unicode=True))
        console.print(f"[green]exported[/] {sum(len(v) for v in events_script['agents'].values())} model "
                      f"turns to {export} — `use: scripted, script: {export}` reproduces the run offline")
    code = 1 if timeline.divergences else 0
    if do_rerun:
        path = export or config.data_path / f"replay-{run_id[:8]}.yaml"
        if export is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(events_script, sort_keys=False, allow_unicode=True))
        differences = run_async(_rerun(config, timeline.record, path, console, live_tools))
        code = max(code, 1 if differences else 0)
    if fork_at is not None:
        run_async(_fork(config, timeline.record, fork_at, model, script, console))
    return code


async def _read(config: KeelConfig, harness: Harness, run_id: str, exporting: bool) -> tuple[Timeline, Any]:
    async with open_runtime(config, harness=harness, executes="none") as rt:
        timeline = await load_timeline(rt, run_id)
        if timeline is None:
            raise ReplayCommandError(f"no run {run_id!r} in {config.database_url}")
        if not exporting:
            return timeline, None
        try:
            return timeline, export_script(timeline.events, timeline.messages)
        except ExportError as exc:
            raise ReplayCommandError(str(exc), 2) from None


async def _rerun(config: KeelConfig, record: RunRecord, script: Path, console: Console,
                 live_tools: bool) -> list[str]:
    offline = offline_config(config, script)
    async with open_runtime(offline, harness=Harness(offline, offline.checkpoint_mode), executes="own") as rt:
        try:
            report = await replay_and_compare(rt, record, live_tools=live_tools)
        except ReplayError as exc:
            raise ReplayCommandError(str(exc), 2) from None
    _print_rerun(console, report)
    return report.differences


def _print_rerun(console: Console, report: RerunReport) -> None:
    console.rule(f"re-run {report.replayed.run_id} on thread {report.replayed.thread_id}")
    for remark in report.remarks:
        console.print(f"[dim]{escape(remark)}[/]", highlight=False)
    if report.tools is not None:
        _print_tools(console, report.tools)
    if report.not_reproducible:
        console.print(f"[yellow]not reproducible[/] ({len(report.not_reproducible)}, left out of the comparison):")
        for line in report.not_reproducible:
            console.print(f"  {escape(line)}", highlight=False)
    if report.differences:
        console.print("[red]✗ the re-run diverged from the recording:[/]")
        for line in report.differences:
            console.print(f"  {escape(line)}", highlight=False)
    else:
        console.print(f"[green]✓ same journal ({report.records} records) and same final state "
                      "(messages, durable channels, files) — offline[/]")


def _print_tools(console: Console, tools: RecordedTools) -> None:
    console.print(f"tools: {len(tools.answered)} call(s) answered from the recording (not executed), "
                  f"{len(tools.live)} executed, each matched and its result checked against it", highlight=False)
    for why, count in Counter(why for _, why in tools.live).items():
        console.print(f"  [dim]executed[/] {count} × {escape(why)}", highlight=False)
    if tools.recovered_calls:
        console.print(f"  {len(tools.recovered_calls)} call(s) answered as the run's recovery answered them "
                      "(outcome unknown, not executed)", highlight=False)


async def _fork(config: KeelConfig, record: RunRecord, step: int, model: str | None, script: Path | None,
                console: Console) -> None:
    if script is not None:
        config = config.model_copy(update={"models": [
            *config.models, ModelConfig(name=FORK_SCRIPT_MODEL, use="scripted", script=str(script.resolve()))]})
        model = FORK_SCRIPT_MODEL
    async with open_runtime(config, harness=Harness(config, config.checkpoint_mode), executes="own") as rt:
        try:
            forked = await fork(rt, record, step, model_name=model)
        except ReplayError as exc:
            raise ReplayCommandError(str(exc), 2) from None
        timeline = await load_timeline(rt, forked.run_id)
    console.rule(f"fork {forked.run_id} from step {step} — {forked.status.value}")
    if timeline is not None:
        render_timeline(console, timeline)


# -- drawing ----------------------------------------------------------------------------------


def render_timeline(console: Console, timeline: Timeline) -> None:
    record = timeline.record
    reasons = ", ".join(f"{r.get('code')} ({r.get('source')})" for r in record.stop_reasons) or "none"
    style = "green" if record.status == RunStatus.success else "red"
    console.rule(f"run {record.run_id}")
    console.print(f"thread {record.thread_id} · assistant {record.assistant_id} · [{style}]{record.status.value}[/] · "
                  f"stop reasons: {escape(reasons)} · tokens {record.usage.get('total_tokens', 0):,}", highlight=False)
    attempts = timeline.to_dict()["attempts"]
    console.print("attempts: " + "; ".join(f"{a['attempt']} {a['began'] or '?'} → {a['ended'] or 'no end'}"
                                           for a in attempts), highlight=False)
    console.print(f"stream: {timeline.stream_state} ({len(timeline.stream)} events)"
                  + ("" if timeline.stream else " — the stream is a live view; the journal and checkpoints "
                     "are the record"), highlight=False)
    table = Table("seq", "step", "att", "", "what", box=None, pad_edge=False, show_edge=False)
    for row in _rows(timeline.items, 0):
        table.add_row(*row)
    console.print(table)
    if timeline.divergences:
        console.print(f"[red]✗ {len(timeline.divergences)} divergence(s):[/]")
        for d in timeline.divergences:
            at = f" (seq {d.journal_seq})" if d.journal_seq is not None else ""
            console.print(f"  [red]{d.code}[/]{at}: {escape(d.detail)}", highlight=False)
    else:
        console.print("[green]✓ journal, checkpoints and stream agree[/]")


def _rows(items: list[Item], depth: int) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    pending: list[Item] = []
    indent = "  " * depth + ("└ " if depth else "")

    def flush() -> None:
        if pending:
            names = Counter(i.kind for i in pending)
            first, last = pending[0].ident, pending[-1].ident
            span = f"#{first}" if first == last else f"#{first}–#{last}"
            what = ", ".join(f"{n}×{c}" if c > 1 else n for n, c in names.items())
            rows.append(("", _num(pending[0].step), _num(pending[0].attempt), "[dim]≋[/]",
                         f"[dim]{indent}stream {span}: {escape(what)}[/]"))
            pending.clear()

    for item in items:
        if item.source == "stream":
            pending.append(item)
            continue
        flush()
        mark, text = _describe(item)
        seq = str(item.journal_seq) if item.source == "journal" else ""
        rows.append((seq, _num(item.step), _num(item.attempt), mark, indent + text))
        for path in item.files:
            rows.append(("", "", "", "", f"{' ' * len(indent)}   [magenta]✎ {escape(str(path['path']))}[/] ({path['change']})"))
        if item.children:
            rows.extend(_rows(item.children, depth + 1))
    flush()
    return rows


def _num(value: int | None) -> str:
    return "" if value is None else str(value)


def _describe(item: Item) -> tuple[str, str]:
    d, caller = item.data, escape(str(item.caller or ""))
    kind = item.kind
    if item.source == "checkpoint":
        ns = f" ns {d['namespace']}" if d.get("namespace") else ""
        return "[blue]◆[/]", f"[blue]checkpoint step {item.step}[/] ({d.get('source')}{ns}) {str(item.ident)[:13]}"
    if kind == "model.call":
        calls = f", {d.get('tool_calls')} tool call(s)" if d.get("tool_calls") else ""
        est = " (estimated)" if d.get("estimated") else ""
        return "[cyan]●[/]", (f"model [bold]{caller}[/] {escape(str(d.get('model')))}: {d.get('input_tokens')}→"
                              f"{d.get('output_tokens')} tokens{est}, {d.get('latency_ms')} ms, {d.get('finish_reason')}{calls}")
    if kind == "model.error":
        return "[red]✗[/]", f"model error {caller}: {d.get('kind')} {d.get('status') or ''} {escape(str(d.get('message'))[:80])}"
    if kind == "tool.call":
        colour = "green" if d.get("status") == "ok" else "red"
        return f"[{colour}]→[/]", (f"tool [bold]{escape(str(d.get('name')))}[/] {caller} [{colour}]{d.get('status')}[/] "
                                   f"{d.get('duration_ms')} ms · {d.get('call_id')}")
    if kind == "intervention":
        return "[yellow]▲[/]", f"guard {escape(str(d.get('middleware')))}: {d.get('action')} — {escape(str(d.get('detail'))[:90])}"
    if kind == "stop_reason":
        return "[yellow]⚑[/]", f"[yellow]stop reason {d.get('code')}[/] ({escape(str(d.get('source')))}) — {escape(str(d.get('detail'))[:80])}"
    if kind == "compaction":
        return "[magenta]⇣[/]", (f"compaction {caller}: request {d.get('request_messages_before')}→{d.get('request_messages_after')}"
                                 f" messages, {d.get('request_tokens_before')}→{d.get('request_tokens_after')} tokens")
    if kind == "subagent.start":
        end = d.get("end") or {}
        usage = end.get("usage") or {}
        outcome = f"{end.get('status')}, {end.get('stop_reason') or 'clean'}, {usage.get('total_tokens', 0)} tokens" if end else "no end"
        return "[bold]⑂[/]", (f"subagent [bold]{escape(str(d.get('subagent_type')))}[/] {d.get('task_id')}: "
                              f"{escape(str(d.get('description')))} → {outcome}")
    if kind == "run.start":
        resumed = f", resumed from attempt {d.get('resumed_from')}" if d.get("resumed_from") else ""
        return "[bold]▶[/]", f"attempt {d.get('attempt')} started by {d.get('owner')} (model {d.get('model')}{resumed})"
    if kind == "run.recovered":
        return "[bold]↻[/]", (f"recovered: attempt {d.get('lost_attempt')} of {d.get('lost_owner')} lost → attempt "
                              f"{d.get('attempt')} ({d.get('policy')})")
    if kind == "run.end":
        return "[bold]■[/]", f"run ended [bold]{d.get('status')}[/]" + (f": {escape(str(d.get('error')))}" if d.get("error") else "")
    if kind == "chain.manifest":
        return "[dim]≡[/]", f"[dim]guard chain: {len(d.get('order') or [])} guards[/]"
    if kind == "file.changed":
        return "[magenta]✎[/]", f"{escape(str(d.get('path')))} {d.get('change')} (no tool call reported it)"
    return "·", f"{kind} {caller} {escape(json.dumps(d, default=str)[:90])}"


__all__ = ["ReplayCommandError", "render_timeline", "replay"]
