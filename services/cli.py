"""The ``trialbus`` command line. Thin: parse arguments, call a function, print.

Longer than 350 lines because each command declares its options here (typer reads
them from the signatures); the work is elsewhere, and the live and steering
commands have their own modules (cli_live, cli_schedule, cli_deploy).

Exit codes (README): 0 ok; 1 experiment finished with unscored trials; 2 bad input
(manifest, task folder, job folder, an output file that cannot be written); 3 NATS or
ledger unreachable; 4 --wait (or status --follow) timed out; 130 interrupted. The live
commands (experiments, status --follow, logs, runners) are in services/cli_live.py.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Concatenate

import typer
from rich.console import Console
from rich.markup import escape

from services.cli_args import ExperimentArg, JsonOpt, JunitOpt, LatestExperiment
from services.common import errors as E
from services.common.errors import (
    LedgerUnavailable,
    ObjectAccessDenied,
    ObjectCorrupt,
    TransientError,
    UserInputError,
)
from services.common.logging import configure_logging
from services.common.settings import CommonSettings, SubmitterSettings
from services.common.stackfile import settings_for

if TYPE_CHECKING:
    from services.common.ports import Ledger
    from services.reports.trials import TrialFilter

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run Harbor trials of agents on tasks across runners, and report their scores "
    "from the ledger. `trialbus demo` runs an example end to end; `trialbus up` starts "
    "the stack on this machine.",
)
OUTPUT_WIDTH = 200
"""Columns of the tables when stdout is not a terminal (a CI log, a pipe) and COLUMNS is
unset: rich's default there is 80, which cut every id in a table to a few letters."""
out = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else OUTPUT_WIDTH)
err = Console(stderr=True, soft_wrap=True)


def _run[T](coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine; map trialbus errors to the documented exit codes."""
    # Log lines go to stderr, warnings and worse only: stdout is the command's output
    # (``--json`` must be nothing but JSON, even when this command creates the streams).
    configure_logging("WARNING")
    # nats-py logs a traceback per failed connection attempt; a command says it once,
    # clearly ("cannot reach NATS at ...", exit 3), or imports without it.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    except UserInputError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(E.EXIT_USER_ERROR) from None
    except (TransientError, LedgerUnavailable, ConnectionError, OSError) as exc:
        err.print(f"[red]unavailable:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(E.EXIT_UNAVAILABLE) from None
    except (ObjectAccessDenied, ObjectCorrupt) as exc:
        # The stack cannot do it as configured (a right its NATS user lacks) or its
        # bucket holds damaged bytes: said in one line, not as a traceback.
        err.print(f"[red]refused by the stack:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(E.EXIT_UNAVAILABLE) from None
    except KeyboardInterrupt:
        raise typer.Exit(E.EXIT_INTERRUPTED) from None


def _call[**P, T](
    op: Callable[Concatenate[CommonSettings, P], Awaitable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run one of services.submitter.commands with the settings (stack file filled in)."""
    settings = settings_for(CommonSettings)
    return _run(lambda: op(settings, *args, **kwargs))


def _read[**P, T](
    query: Callable[Concatenate[Ledger, P], Awaitable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run a report query (services.reports.queries) against the ledger."""
    from services.submitter.commands import read

    return _call(read, query, *args, **kwargs)


def _printed_as_json(data: Any, json_out: bool) -> bool:
    """With --json, print ``data`` as JSON on stdout; whether it did (the command is done)."""
    if json_out:
        out.print_json(json.dumps(data))
    return json_out


def print_leaderboard(rows: list[dict[str, Any]], title: str) -> None:
    from services.reports.tables import leaderboard_table

    out.print(leaderboard_table(rows, title))


@app.command()
def submit(
    manifest: Annotated[Path, typer.Argument(help="Experiment manifest (YAML or JSON).")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow progress until it completes.")
    ] = False,
    json_out: JsonOpt = False,
    timeout: Annotated[
        float, typer.Option(help="Give up waiting after this many seconds.")
    ] = 3600.0,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check the manifest as a submission is checked and say what would run; "
            "nothing is published. Against the stack when one answers (its live runners, "
            "the owner, quotas), else the manifest and task folders alone (a CI check).",
        ),
    ] = False,
    junit: JunitOpt = None,
) -> None:
    """Validate a manifest, publish its trials, optionally wait for the results."""
    from services.submitter.commands import plan_submission, submit_and_wait

    settings = settings_for(SubmitterSettings)
    if junit is not None and not wait:
        err.print("error: --junit writes the results: give --wait too")
        raise typer.Exit(E.EXIT_USER_ERROR)
    if dry_run:
        if wait:
            err.print("error: --dry-run publishes nothing to wait for; give one of the two")
            raise typer.Exit(E.EXIT_USER_ERROR)
        progress = None if json_out else err
        _print_plan(_run(lambda: plan_submission(settings, manifest, progress)), json_out)
        return
    result = _run(
        lambda: submit_and_wait(
            settings, manifest, wait=wait, timeout_s=timeout, progress=None if json_out else err
        )
    )
    if not _printed_as_json(result.summary, json_out):
        s = result.summary
        err.print(
            f"experiment [bold]{s['experiment_id']}[/bold]: {s['n_trials']} trials, "
            f"{s['n_published']} published, {s['n_duplicates']} already queued, "
            f"{s['n_already_scored']} already scored",
            highlight=False,
        )
        if result.rows is not None:
            print_leaderboard(result.rows, f"leaderboard: {s['experiment_id']}")
    if junit is not None:
        _write_junit(junit, result.summary["experiment_id"])
    raise typer.Exit(result.exit_code)


def _write_junit(path: Path, experiment_id: str, where: TrialFilter | None = None) -> None:
    """Write the JUnit XML report of the experiment's recorded trials (those ``where``
    keeps; None: all) to ``path``."""
    from services.reports.junit import experiment_junit
    from services.reports.trials import EVERY_TRIAL

    _write(path, _read(experiment_junit, experiment_id, where or EVERY_TRIAL)[1])


def _print_plan(plan: dict[str, Any], json_out: bool) -> None:
    if _printed_as_json(plan, json_out):
        return
    needs = ", ".join(plan["runner_variables"]) or "none"
    requires = f", requires {', '.join(plan['requires'])}" if plan["requires"] else ""

    def n(count: int, noun: str) -> str:
        return f"{count} {noun}" if count == 1 else f"{count} {noun}s"

    against = "checked against the stack" if plan["stack"] else "no stack answered"
    err.print(
        f"manifest ok ({against}): experiment {plan['experiment_id']} would run "
        f"{n(plan['n_trials'], 'trial')}: {n(len(plan['tasks']), 'task')} x "
        f"{n(len(plan['agents']), 'agent')} ({', '.join(plan['agents'])}) x "
        f"{n(plan['repetitions'], 'repetition')}, pool {plan['pool']!r}{requires}; "
        f"variables the runners need: {needs}",
        highlight=False,
        markup=False,
    )
    err.print(f"not checked: {plan['not_checked']}", highlight=False)


@app.command()
def leaderboard(
    experiment: LatestExperiment = None,
    json_out: JsonOpt = False,
) -> None:
    """Per agent x model: scored / total, mean reward and pass rate with 95% CIs, pass@k."""
    from services.reports.queries import experiment_leaderboard

    exp_id, rows = _read(experiment_leaderboard, experiment)
    if _printed_as_json(rows, json_out):
        return
    print_leaderboard(rows, f"leaderboard: {exp_id}")


def _write(path: Path, body: bytes) -> None:
    """Write an output file the user named; exit 2 naming the file when it cannot be."""
    try:
        path.write_bytes(body)
    except OSError as exc:
        err.print(
            f"[red]error:[/red] cannot write {escape(str(path))}: {exc.strerror}", highlight=False
        )
        raise typer.Exit(E.EXIT_USER_ERROR) from None
    err.print(f"wrote {path}", highlight=False, markup=False)


@app.command()
def report(
    experiment: LatestExperiment = None,
    json_out: JsonOpt = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML page.")
    ] = None,
    png: Annotated[
        Path | None,
        typer.Option(
            "--png", help="Also write a PNG: the leaderboard's error bars and the task matrix."
        ),
    ] = None,
) -> None:
    """Leaderboard with 95% intervals, pass@k, per-key means, usage, per task, failures."""
    from services.reports.html import render_html
    from services.reports.queries import experiment_report
    from services.reports.tables import report_renderable

    data = _read(experiment_report, experiment)
    if html is not None:
        _write(html, render_html(data).encode("utf-8"))
    if png is not None:
        from services.reports.plots import render_png  # matplotlib: only for --png

        _write(png, render_png(data))
    if _printed_as_json(data, json_out):
        return
    out.print(report_renderable(data))


@app.command()
def trials(
    experiment: LatestExperiment = None,
    unscored: Annotated[
        bool, typer.Option("--unscored", help="Only finished trials that do not count in scores.")
    ] = False,
    task: Annotated[str | None, typer.Option(help="Only this task's trials.")] = None,
    agent: Annotated[
        str | None, typer.Option(help="Only this agent's trials (agent@model, or the agent).")
    ] = None,
    json_out: JsonOpt = False,
    junit: JunitOpt = None,
) -> None:
    """Every trial running or recorded: id, task, agent, repetition, status, reward,
    failure, attempts, how long it ran and where (the ids ``logs`` and ``retry`` take)."""
    from services.reports.tables import trials_table
    from services.reports.trials import TrialFilter, select
    from services.submitter.follow import trial_list

    settings = settings_for(CommonSettings)
    exp_id, lines, reached = _run(lambda: trial_list(settings, experiment))
    if not reached:
        err.print("warning: NATS is out of reach: running trials are not listed")
    where = TrialFilter(unscored, task, agent)
    if junit is not None:
        _write_junit(junit, exp_id, where)
    chosen = select(lines, where)
    if _printed_as_json(chosen, json_out):
        return
    out.print(trials_table(chosen, f"trials: {exp_id}", lines))


@app.command()
def compare(
    experiment_a: Annotated[str, typer.Argument(help="Experiment of side A.")],
    experiment_b: Annotated[
        str | None, typer.Argument(help="Experiment of side B (default: the same as A).")
    ] = None,
    agent_a: Annotated[
        str | None, typer.Option("--a", help="Side A's agent: AGENT or AGENT@MODEL.")
    ] = None,
    agent_b: Annotated[
        str | None, typer.Option("--b", help="Side B's agent: AGENT or AGENT@MODEL.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Paired comparison on the tasks both sides scored: difference, 95% CI, McNemar."""
    from services.reports.queries import comparison
    from services.reports.tables import comparison_renderable

    data = _read(comparison, experiment_a, experiment_b, agent_a, agent_b)
    if _printed_as_json(data, json_out):
        return
    out.print(comparison_renderable(data))


def _register_schedule_commands() -> None:
    from services.cli_schedule import register

    register(app, _call, err, _printed_as_json)


_register_schedule_commands()


@app.command(name="import")
def import_(
    job_dir: Annotated[
        Path,
        typer.Argument(
            help="A Harbor job folder (its config.json and trial folders), e.g. from "
            "`harbor run` or `trialbus export`."
        ),
    ],
    json_out: JsonOpt = False,
    as_new: Annotated[
        bool,
        typer.Option(
            "--as-new",
            help="Import a copied or renamed Harbor job folder as a new experiment, "
            "with trial ids of its own (its trials are already another experiment's).",
        ),
    ] = False,
) -> None:
    """Import a Harbor job folder into the ledger (idempotent)."""
    from services.submitter.commands import import_job

    # It publishes result_imported, which only the importer role may.
    settings = settings_for(CommonSettings, role="importer")
    summary = _run(lambda: import_job(settings, job_dir, as_new=as_new))
    if _printed_as_json(summary, json_out):
        return
    err.print(
        f"experiment {summary['experiment_id']}: "
        f"{summary['total']} trials: {summary['imported']} imported, "
        f"{summary['unchanged']} unchanged, {summary['partial']} partial",
        highlight=False,
    )
    for line in summary.get("errors", [])[:20]:
        err.print(f"  {line}", highlight=False, markup=False)
    if not summary["announced"]:
        err.print("NATS unreachable: recorded in the ledger without ResultImported events")


@app.command()
def export(
    experiment: ExperimentArg,
    dest: Annotated[
        Path, typer.Argument(help="Folder to write <experiment>/ into (harbor view DEST).")
    ],
    json_out: JsonOpt = False,
) -> None:
    """Write an experiment's Harbor job folder from the ledger and the results bucket."""
    from services.submitter.commands import export_job

    # Reads the results bucket, which the importer role may.
    settings = settings_for(CommonSettings, role="importer")
    summary = _run(lambda: export_job(settings, experiment, dest))
    if _printed_as_json(summary, json_out):
        return
    err.print(
        f"wrote {summary['job_dir']}: {summary['written']} of {summary['trials']} trial "
        f"folders ({summary['bytes_fetched']} bytes fetched); open it with "
        f"`harbor view {dest}`",
        highlight=False,
    )
    if summary["without_folder"]:
        err.print(
            f"  {len(summary['without_folder'])} trials have no stored folder (they never "
            "made one, or were imported from a job folder)",
            highlight=False,
        )
    for trial_id, why in list(summary["unavailable"].items())[:20]:
        err.print(f"  {trial_id}: not exported: {why}", highlight=False, markup=False)


@app.command()
def up(
    data_dir: Annotated[Path, typer.Option(help="Servers' storage and job folders.")] = Path(
        ".trialbus"
    ),
    runners: Annotated[int, typer.Option(min=1, max=64, help="Runner processes.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, max=4096, help="Trials per runner.")] = 4,
) -> None:
    """Start the embedded stack (nats-server, SecantusDB, the four services) until Ctrl-C.

    Its services take this shell's TRIALBUS_* settings, but for those the stack decides
    itself (its servers, folders, credentials); it prints which it passed and which not.
    """
    from infra.stack import run_stack_forever

    raise typer.Exit(
        run_stack_forever(data_dir, runners=runners, concurrency=concurrency, console=err)
    )


@app.command()
def demo(
    manifest: Annotated[Path, typer.Argument(help="Experiment manifest (YAML or JSON).")] = Path(
        "examples/experiment.yaml"
    ),
    data_dir: Annotated[
        Path, typer.Option(help="Servers' storage and job folders (emptied first).")
    ] = Path(".trialbus/demo"),
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Trials at once.")] = 4,
) -> None:
    """Start the embedded stack, run MANIFEST end to end, print the leaderboard, stop."""
    from infra.stack import run_demo

    raise typer.Exit(
        run_demo(manifest, data_dir, concurrency=concurrency, console=err, table=print_leaderboard)
    )


@app.command()
def service(
    name: Annotated[str, typer.Argument(help="runner | importer | watcher | submitter")],
) -> None:
    """Run one service in the foreground (what compose and `trialbus up` start)."""
    import importlib

    if name not in ("runner", "importer", "watcher", "submitter"):
        err.print(f"[red]error:[/red] unknown service {name!r}")
        raise typer.Exit(E.EXIT_USER_ERROR)
    importlib.import_module(f"services.{name}.app").main()


@app.command(name="api-token")
def api_token(
    tokens_file: Annotated[Path, typer.Argument(help="The HTTP API's tokens file (0600).")],
    user: Annotated[str | None, typer.Option(help="Identity the token acts as.")] = None,
    team: Annotated[str | None, typer.Option(help="Team recorded with the identity.")] = None,
    admin: Annotated[bool, typer.Option(help="May cancel anyone's experiments.")] = False,
    priority_class: Annotated[
        list[str] | None,
        typer.Option(
            help="A priority class it may submit in (repeat; default: the default "
            "class and lower ones, docs/scheduling.md)."
        ),
    ] = None,
) -> None:
    """Add an HTTP API token to TOKENS_FILE (created 0600) and print it, once.

    The file keeps only the token's sha256: a lost token is replaced, never recovered.
    """
    from services.submitter.api_tokens import ApiConfigError, issue_token

    if user is None and team is None:
        err.print("[red]error:[/red] name the identity: --user NAME and/or --team NAME")
        raise typer.Exit(E.EXIT_USER_ERROR)
    try:
        token = issue_token(
            tokens_file, user=user, team=team, admin=admin, priority_classes=priority_class
        )
    except ApiConfigError as exc:
        # escape: the message may quote a pattern such as [a-z], which rich would eat.
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(E.EXIT_USER_ERROR) from None
    print(token)


@app.command(name="api-docs")
def api_docs(
    check: Annotated[bool, typer.Option(help="Only compare; exit 1 when stale.")] = False,
    root: Annotated[Path, typer.Option(help="Repository root.")] = Path("."),
) -> None:
    """Write docs/openapi.json and docs/asyncapi.json from the code (services/api_docs.py)."""
    from services.api_docs import stale_documents, write_documents

    configure_logging("ERROR")  # building the API app warns that it has no auth: it is never served
    if check:
        stale = stale_documents(root)
        for rel in stale:
            err.print(f"stale: {rel} (regenerate with `trialbus api-docs` or `make api-docs`)")
        raise typer.Exit(1 if stale else 0)
    for rel in write_documents(root):
        print(f"wrote {rel}")


def _register_live_commands() -> None:
    from services.cli_live import register

    register(app, _run, out, err, _write_junit)


_register_live_commands()


def _register_deploy_commands() -> None:
    from services.cli_deploy import register

    register(app, _run, err)


_register_deploy_commands()


def _help_from_docstrings() -> None:
    """Each command's help as a reader sees it: its docstring with code marked by one
    backquote (as the README writes it), and its summary in ``trialbus --help`` as one
    line of prose (typer keeps the docstring's line breaks there, which cut the list's
    sentences mid-phrase)."""
    for info in app.registered_commands:
        doc = inspect.getdoc(info.callback) if info.callback else None
        if info.short_help is None and info.help is None and doc:
            info.help = doc.replace("``", "`")
            info.short_help = " ".join(info.help.split("\n\n")[0].split())


_help_from_docstrings()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(E.EXIT_INTERRUPTED)
