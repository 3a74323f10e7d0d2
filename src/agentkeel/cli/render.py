"""Terminal rendering with rich: live progress lines and the run ledger."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

ARG_PREVIEW = 60


def _preview(value: Any, limit: int = ARG_PREVIEW) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def progress_lines(event: str, data: Any) -> list[str]:
    """Human lines for one published stream event (``updates`` mode of an agent graph)."""
    if event == "stop_reason":
        return [f"[yellow]⚑ stop reason[/] [bold]{data.get('code')}[/] — {data.get('detail', '')}"]
    if event == "error":
        return [f"[red]✗ {data.get('error')}: {data.get('message')}[/]"]
    if event != "updates" or not isinstance(data, dict):
        return []
    lines: list[str] = []
    for node, update in data.items():
        messages = update.get("messages", []) if isinstance(update, dict) else []
        for message in messages if isinstance(messages, list) else []:
            if not isinstance(message, dict):
                continue
            kind = message.get("type")
            if kind == "ai":
                for call in message.get("tool_calls") or []:
                    args = call.get("args", {})
                    target = args.get("path") or args.get("pattern") or args.get("command") or ""
                    lines.append(f"[cyan]→ {call.get('name')}[/]([white]{_preview(target)}[/])")
                if not message.get("tool_calls") and message.get("content"):
                    lines.append(f"[green]✎ answer[/] {_preview(message['content'], 100)}")
            elif kind == "tool":
                mark = "[red]✗[/]" if message.get("status") == "error" else "[green]✓[/]"
                lines.append(f"   {mark} {message.get('name')}: {_preview(message.get('content', ''), 70)}")
            elif node not in ("model", "tools"):
                lines.append(f"[dim]{node}[/]: {_preview(message.get('content', ''))}")
    return lines


def why_lines(ledger: dict[str, Any]) -> list[str]:
    """The plain-text answer to "why did it stop?" before the stop reasons are listed.

    "Finished cleanly" only for a success with no stop reason; a failed run says what failed —
    the error type and message, the model (configured name and ``provider:model``), the kind of
    provider error and the key variable to check when the provider rejected the key.
    """
    status, reasons = ledger["status"], ledger["stop_reasons"]
    if status == "success":
        if reasons:
            return []  # capped: the reasons below say why
        return ["  finished cleanly: the model gave its final answer; no guard or limit stopped it"]
    if status == "error":
        return _error_lines(ledger)
    if status == "interrupted" and not reasons:
        return ["  interrupted before it finished (no stop reason was recorded)"]
    if status == "timeout" and not reasons:
        return [f"  timed out: {ledger.get('error') or 'the run exceeded its wall-clock limit'}"]
    return []


def _error_lines(ledger: dict[str, Any]) -> list[str]:
    detail = ledger.get("error_detail") or {}
    if not detail:
        return [f"  failed: {ledger.get('error') or 'the run ended in error (no message was recorded)'}"]
    status = f"HTTP {detail['status']}" if detail.get("status") is not None else None
    what = ", ".join(part for part in (detail.get("kind"), status) if part)
    lines = [f"  failed: {detail.get('type')}{f' ({what})' if what else ''}: {detail.get('message')}"]
    if detail.get("model"):
        attempts = detail.get("attempts")
        tried = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
        lines.append(f"  model {detail['model']} ({detail.get('use')}){tried}")
    if detail.get("key_env"):
        lines.append(f"  check the API key in the environment variable {detail['key_env']}")
    return lines


def render_ledger(console: Console, ledger: dict[str, Any]) -> None:
    status = ledger["status"]
    colour = {"success": "green", "error": "red", "timeout": "red", "interrupted": "yellow"}.get(status, "white")
    quality = "clean" if ledger["clean"] else ("capped" if ledger["stop_reasons"] else status)
    console.rule(f"[bold]Run ledger[/] {ledger['run_id']}")
    console.print(
        f"status [bold {colour}]{status}[/] ({quality}) · attempt {ledger['attempt']} · "
        f"thread {ledger['thread_id']} · assistant {ledger['assistant_id']}"
        + (f" · {ledger['duration_s']:.2f} s" if ledger["duration_s"] is not None else "")
    )
    if ledger["error"]:
        console.print(f"[red]error:[/] {ledger['error']}")

    console.print("\n[bold]Why did it stop?[/]")
    for line in why_lines(ledger):
        console.print(line, markup=False, highlight=False)
    for entry in ledger["stop_reasons"]:
        primary = " [bold](primary)[/]" if entry["code"] == ledger["stop_reason"] else ""
        console.print(f"  seq {entry['seq']:>4} {entry['code']}{primary} [{entry['class']}] from {entry['source']}: {entry['detail']}")
    interventions = ledger.get("interventions") or []
    if ledger.get("guards"):
        console.print(f"\n[bold]What did the guards do?[/] [dim]({len(ledger['guards'])} in the chain)[/]")
        if not interventions:
            console.print("  nothing: no guard had to act")
        for item in interventions:
            console.print(f"  seq {item['seq']:>4} {item['middleware']} {item['action']}: {_preview(item['detail'] or '', 90)}")

    usage = ledger["usage"]
    console.print("\n[bold]What did it spend?[/]")
    console.print(
        f"  {usage['total_tokens']:,} tokens ({usage['input_tokens']:,} in / {usage['output_tokens']:,} out) · "
        f"{ledger['model_calls']} model calls · {sum(ledger['tool_calls'].values())} tool calls"
        f" ({ledger['tool_errors']} failed)"
    )
    spend = Table(box=None, padding=(0, 2))
    for column in ("by", "name", "input", "output", "total"):
        spend.add_column(column, justify="right" if column in ("input", "output", "total") else "left")
    for bucket, rows in (("caller", usage.get("by_caller", {})), ("model", usage.get("by_model", {}))):
        for name, row in rows.items():
            spend.add_row(bucket, name, f"{row['input_tokens']:,}", f"{row['output_tokens']:,}", f"{row['total_tokens']:,}")
    console.print(spend)
    if ledger["tool_calls"]:
        console.print("  tools: " + ", ".join(f"{n}×{c}" for n, c in sorted(ledger["tool_calls"].items())))
    _render_subagents(console, ledger.get("subagents") or [])

    console.print("\n[bold]Which step changed which file?[/]")
    changes = ledger["files_changed"]
    if not changes:
        console.print("  no workspace file changed")
    by_agent = any(_agents(change) for change in changes)  # the column only once a record names one
    files = Table(box=None, padding=(0, 1))
    columns = ("change", "file", *(("agent",) if by_agent else ()), "step (journal seq · tool)", "tool call id",
               "before → after")
    for column in columns:
        files.add_column(column, overflow="fold")
    for change in changes:
        step = f"#{change['tool_seq']} {change.get('tool_name')}" if change.get("tool_seq") else "(outside any tool)"
        files.add_row(
            change["change"], change["path"].removeprefix("/workspace/"),
            *((", ".join(_agents(change)) or "-",) if by_agent else ()), step,
            change.get("tool_call_id") or "-",
            f"{(change.get('before_sha256') or '-')[:8]} → {(change.get('after_sha256') or '-')[:8]}",
        )
    if changes:
        console.print(files)

    resume = ledger["resume"]
    console.print("\n[bold]Where can it resume?[/]")
    console.print(
        f"  thread {resume['thread_id']} at checkpoint {resume['checkpoint_id'] or '(none)'} — "
        f"continue with: keel run \"...\" --thread {resume['thread_id']}"
    )
    if resume.get("question"):
        console.print(
            f"  the agent is waiting for an answer to: {resume['question']}\n"
            f"  answer with: keel run --thread {resume['thread_id']} --resume \"...\""
        )


_CHILD_COLOURS = {"completed": "green", "failed": "red", "timed_out": "red", "cancelled": "yellow",
                  "unfinished": "yellow", "running": "cyan"}


def _render_subagents(console: Console, children: list[dict[str, Any]]) -> None:
    """The "Subagents" table: one row per child (``runtime/children.py``); nothing without any."""
    if not children:
        return
    console.print(f"\n[bold]Subagents[/] [dim]({len(children)} started)[/]")
    table = Table(box=None, padding=(0, 1))
    for column in ("seq", "type", "task id", "status", "stop reason(s)", "tokens in / out", "turns", "files changed"):
        table.add_column(column, overflow="fold", justify="right" if column in ("seq", "turns") else "left")
    for child in children:
        usage = child.get("usage")
        files = [str(path).removeprefix("/workspace/") for path in child.get("files_changed") or []]
        turns = child.get("turns")
        table.add_row(
            str(child["seq"]), escape(child.get("subagent_type") or "?"), escape(child["task_id"]),
            f"[{_CHILD_COLOURS.get(child['status'], 'white')}]{escape(child['status'])}[/]",
            escape(_child_reasons(child)),
            f"{usage.get('input_tokens', 0):,} / {usage.get('output_tokens', 0):,}" if usage else "-",
            "-" if turns is None else str(turns),
            escape(", ".join(files)) or "-",
        )
    console.print(table)
    for child in children:
        if child.get("error"):
            console.print(f"  {child['task_id']}: {child['error']}", markup=False, highlight=False)


def _child_reasons(child: dict[str, Any]) -> str:
    """The child's primary code first, then its other codes, each once."""
    codes = [child.get("stop_reason"), *(entry.get("code") for entry in child.get("stop_reasons") or [])]
    unique = list(dict.fromkeys(code for code in codes if code))
    return ", ".join(unique) or "-"


def _agents(change: dict[str, Any]) -> list[str]:
    """Who changed the file (``lead`` or ``subagent:<type>/<task_id>``), in step order, each once;
    empty for a record written before changes named their agent."""
    named = [step.get("agent") for step in change.get("steps") or []] + [change.get("agent")]
    return list(dict.fromkeys(agent for agent in named if agent))
