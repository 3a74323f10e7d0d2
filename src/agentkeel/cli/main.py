"""The ``keel`` command: run, demo, runs list|show, replay, chain, serve, worker."""

from __future__ import annotations

import ipaddress
import json
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentkeel.cli.event_loop import run_async
from agentkeel.cli.render import progress_lines, render_ledger
from agentkeel.config import KeelConfig, load_config
from agentkeel.harness.agents import Harness
from agentkeel.harness.scripted import ScriptError
from agentkeel.runtime.ledger import build_ledger
from agentkeel.runtime.observe import observe
from agentkeel.runtime.records import ConflictError, RunStatus
from agentkeel.runtime.requests import RequestError, RunRequest
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.startup import StartupError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="AgentKeel: owned, bounded, observable runs.")
runs_app = typer.Typer(no_args_is_help=True, help="Inspect runs and their ledgers.")
app.add_typer(runs_app, name="runs")
console = Console()
err = Console(stderr=True)

DEMO_PROMPT = (
    "Research how long-running agent runtimes stay safe (budgets, loop guards, checkpoints) and "
    "write a short report to /workspace/outputs/report.md with sources and a summary."
)
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file ($AGENTKEEL_CONFIG).")]


def _setup(path: Path | None) -> tuple[KeelConfig, Harness]:
    """The validated config and its harness (models, graphs and middleware chains, built once and
    handed to the runtime): a broken reference or a chain that breaks a contract is a clear
    message and exit 2, not a traceback."""
    config = _config(path)
    return config, _harness(config)


def _config(path: Path | None) -> KeelConfig:
    try:
        return load_config(path)
    except ValueError as exc:  # ConfigError
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _harness(config: KeelConfig) -> Harness:
    try:
        return Harness(config, config.checkpoint_mode)
    except (ValueError, ScriptError) as exc:  # GraphLoadError, ChainError, bad scripts
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _warn_unusable(harness: Harness) -> None:
    """A long-lived process starts with unusable models (their runs are refused with the same
    reasons); it says so once, up front, instead of at the first refused run."""
    for line in harness.models.problem_lines():
        err.print(f"[yellow]warning:[/] {line} — its runs are refused", highlight=False, soft_wrap=True)


async def _run_one(rt: Runtime, request: RunRequest, *, quiet: bool) -> tuple[Any, dict[str, Any]]:
    record = await rt.manager.create(request)
    (err if quiet else console).print(f"[dim]run {record.run_id} on thread {record.thread_id} — admitted ({record.status.value})[/]")
    async for event in observe(rt, record.run_id, last_event_id="-1"):
        if not quiet:
            for line in progress_lines(event.event, event.data):
                console.print(line)
    final = await rt.manager.wait(record.run_id)
    assert final is not None
    return final, await build_ledger(final, rt.journal, rt.checkpointer)


def _execute(
    config: KeelConfig, harness: Harness, request: RunRequest, *, quiet: bool = False, as_json: bool = False
) -> int:
    async def main() -> int:
        async with open_runtime(config, harness=harness, executes="own") as rt:
            try:
                final, ledger = await _run_one(rt, request, quiet=quiet or as_json)
            except (RequestError, ConflictError) as exc:
                err.print(f"[red]run refused:[/] {exc}")
                return 2
        if as_json:
            print(json.dumps(ledger, indent=2, default=str))
        else:
            render_ledger(console, ledger)
        return 0 if final.status == RunStatus.success else 1

    return run_async(main())


@app.command()
def run(
    prompt: Annotated[str | None, typer.Argument(help="What the agent should do.")] = None,
    config: ConfigOpt = None,
    model: Annotated[str | None, typer.Option(help="A model name from the config's allowlist.")] = None,
    thread: Annotated[str | None, typer.Option(help="Continue this thread (default: a new one).")] = None,
    assistant: Annotated[str, typer.Option(help="Assistant or graph name.")] = "lead",
    resume: Annotated[str | None, typer.Option(
        help="Answer the question the thread's last run asked (ask_clarification); needs --thread.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the ledger as JSON.")] = False,
) -> None:
    """One run in-process, streamed to the terminal; exit 0 on success (capped or clean)."""
    if (prompt is None) == (resume is None):
        err.print("[red]give either a PROMPT or --resume ANSWER (with --thread), not both or neither[/]")
        raise typer.Exit(2)
    if resume is not None and thread is None:
        err.print("[red]--resume answers a paused thread: give it with --thread[/]")
        raise typer.Exit(2)
    cfg, harness = _setup(config)
    request = RunRequest(
        thread_id=thread or f"thread-{uuid.uuid4().hex[:12]}", assistant_id=assistant,
        input=None if prompt is None else {"messages": [{"role": "user", "content": prompt}]},
        command=None if resume is None else {"resume": resume},
        stream_mode=["updates"], model_name=model,
    )
    raise typer.Exit(_execute(cfg, harness, request, as_json=json_out))


@app.command()
def demo(config: ConfigOpt = None) -> None:
    """A long scripted research-and-report task on the embedded default, then its ledger."""
    cfg, harness = _setup(config)
    console.rule("[bold]AgentKeel demo[/] — a scripted research-and-report run")
    console.print(f"[dim]database {cfg.database_url} · stream {cfg.stream} · data {cfg.data_path}[/]")
    request = RunRequest(
        thread_id=f"demo-{uuid.uuid4().hex[:8]}",
        input={"messages": [{"role": "user", "content": DEMO_PROMPT}]},
        stream_mode=["updates"],
    )
    raise typer.Exit(_execute(cfg, harness, request))


@runs_app.command("list")
def runs_list(
    config: ConfigOpt = None,
    thread: Annotated[str | None, typer.Option(help="Only this thread's runs.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print the run records as JSON.")] = False,
) -> None:
    """Recent runs, newest first."""
    cfg, harness = _setup(config)

    async def main() -> list[Any]:
        async with open_runtime(cfg, harness=harness, executes="none") as rt:
            return await rt.store.list_runs(thread_id=thread, limit=limit)

    records = run_async(main())
    if json_out:
        print(json.dumps([r.to_dict() for r in records], indent=2, default=str))
        return
    table = Table("run_id", "thread", "assistant", "status", "stop reason", "tokens", "created")
    table.columns[0].no_wrap = True
    for r in records:
        table.add_row(r.run_id, r.thread_id, r.assistant_id, r.status.value, r.stop_reason or "-",
                      f"{r.usage.get('total_tokens', 0):,}", r.created_at.strftime("%Y-%m-%d %H:%M:%S"))
    console.print(table if records else "no runs")


@runs_app.command("show")
def runs_show(
    run_id: str,
    config: ConfigOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the ledger as JSON.")] = False,
) -> None:
    """The ledger of one run: why it stopped, what it spent, what it changed, where it can resume."""
    cfg, harness = _setup(config)

    async def main() -> dict[str, Any] | None:
        async with open_runtime(cfg, harness=harness, executes="none") as rt:
            record = await rt.store.get(run_id)
            return None if record is None else await build_ledger(record, rt.journal, rt.checkpointer)

    ledger = run_async(main())
    if ledger is None:
        err.print(f"[red]no run {run_id!r} in {cfg.database_url}[/]")
        raise typer.Exit(1)
    if json_out:
        print(json.dumps(ledger, indent=2, default=str))
    else:
        render_ledger(console, ledger)


@app.command("replay")
def replay_run(
    run_id: str,
    config: ConfigOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the timeline as JSON.")] = False,
    export: Annotated[Path | None, typer.Option(
        "--export", help="Write a scripted-model file that reproduces the run offline.")] = None,
    do_rerun: Annotated[bool, typer.Option(
        "--rerun", help="Re-run it offline from its recorded model outputs and compare journal and final state.")] = False,
    fork_at: Annotated[int | None, typer.Option(
        "--fork-at", help="Continue its thread from the checkpoint at this step (with --model or --script).")] = None,
    model: Annotated[str | None, typer.Option(help="The model a fork runs with (from the config).")] = None,
    script: Annotated[Path | None, typer.Option(help="A scripted-model file a fork runs with.")] = None,
    live_tools: Annotated[bool, typer.Option(
        "--live-tools", help="With --rerun: execute the tools again instead of answering them from the recording.")] = False,
) -> None:
    """The aligned timeline of one run: journal, checkpoints and stream on one axis, subagents
    nested, divergences flagged (exit 1 when any); its export, offline re-run and forks."""
    from agentkeel.cli.replay import ReplayCommandError, replay

    if model is not None and script is not None:
        err.print("[red]give a fork either --model or --script, not both[/]")
        raise typer.Exit(2)
    cfg, harness = _setup(config)
    try:
        code = replay(cfg, harness, run_id, console=console, as_json=json_out, export=export, do_rerun=do_rerun,
                      fork_at=fork_at, model=model, script=script, live_tools=live_tools)
    except ReplayCommandError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(exc.code) from None
    raise typer.Exit(code)


@app.command()
def chain(
    agent: Annotated[str, typer.Option("--agent", help="Assistant whose chain to print.")] = "lead",
    kind: Annotated[str, typer.Option(help="Chain kind: lead, or subagent (the chain a subagent of this agent runs).")] = "lead",
    config: ConfigOpt = None,
) -> None:
    """Print, as JSON, the checked middleware chain an agent's runs execute: per hook axis the
    effective order, and every member's contract."""
    from agentkeel.harness.agents import UnknownAssistant
    from agentkeel.harness.middleware.catalog import build_agent_chain

    cfg, harness = _setup(config)
    if kind not in ("lead", "subagent"):
        err.print(f"[red]--kind must be 'lead' or 'subagent', got {kind!r}[/]")
        raise typer.Exit(2)
    try:
        resolved = harness.resolve(agent)
        if resolved.kind != "agent":
            err.print(f"[red]{agent!r} is a user graph: it has no middleware chain[/]")
            raise typer.Exit(2)
        built = harness.chain(resolved) if kind == "lead" else build_agent_chain(
            "subagent", cfg.limits, summarization=cfg.subagents.summarization,
        )
    except (UnknownAssistant, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    print(json.dumps(built.manifest(), indent=2))


@app.command()
def serve(
    config: ConfigOpt = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 2024,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    no_worker: Annotated[bool, typer.Option(
        "--no-worker", help="Serve HTTP only; `keel worker` processes execute the runs.")] = False,
    insecure: Annotated[bool, typer.Option(
        "--insecure", help="Allow a non-loopback --host although auth.mode is none.")] = False,
) -> None:
    """The HTTP gateway (LangGraph Agent Server API) until SIGTERM/SIGINT, then drain and exit 0."""
    from agentkeel.cli.serve import serve_gateway  # the web stack loads only for this command

    cfg = _config(config)
    if not is_loopback_host(host) and not insecure and cfg.auth.mode == "none":
        err.print(
            f"[red]--host {host!r} would expose the API beyond this machine, and the API has no "
            "authentication (auth.mode: none): anyone who can reach the port could read every thread "
            "and run any agent. Bind a loopback address (127.0.0.1), configure auth (auth.mode: api_keys, "
            "jwt or langgraph), or pass --insecure if a proxy in front authenticates every request (and "
            "list the names clients use in gateway.allowed_hosts).[/]"
        )
        raise typer.Exit(2)
    harness = _harness(cfg)
    _warn_unusable(harness)
    raise typer.Exit(serve_gateway(cfg, harness, host, port, log_level, worker=not no_worker))


@app.command()
def worker(
    config: ConfigOpt = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Serve /metrics and /healthz on this port (0: any free port; "
        "default: worker.metrics_port, else none).")] = None,
    metrics_host: Annotated[str | None, typer.Option(
        help="Interface of the metrics endpoint (default: worker.metrics_host, 127.0.0.1).")] = None,
) -> None:
    """Execute runs without serving the API: claim them from the shared database, renew their leases,
    recover the runs of lost workers; until SIGTERM/SIGINT, then drain and exit 0."""
    from agentkeel.cli.worker import run_worker

    cfg, harness = _setup(config)
    if metrics_port is not None:
        cfg.worker.metrics_port = metrics_port
    if metrics_host is not None:
        cfg.worker.metrics_host = metrics_host
    if cfg.worker.metrics_port is not None and not is_loopback_host(cfg.worker.metrics_host):
        err.print(f"[yellow]The metrics endpoint on {cfg.worker.metrics_host!r} has no authentication: "
                  "anyone who can reach the port can read the worker's metrics.[/]")
    _warn_unusable(harness)
    raise typer.Exit(run_worker(cfg, harness))


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except StartupError as exc:  # the database or data_dir, named, instead of a traceback
        err.print(f"cannot start: {exc}", style="red", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
