"""The ``trialbus`` commands that watch things live: ``experiments``, ``status
--follow``, ``attach``, ``logs``, ``runners`` and ``queue``. Thin like services/cli.py: parse, call
services.submitter.follow, print; registered on the CLI's app by ``register``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from services.cli_args import ExperimentArg, JsonOpt, JunitOpt
from services.common import errors as E
from services.common.priority import DEFAULT_CLASS
from services.common.settings import CommonSettings
from services.common.stackfile import settings_for
from services.reports.progress import ExperimentRow, RunnerRow, duration, rate_and_eta, when
from services.reports.queue import QueueView

type Runner = Callable[[Callable[[], Awaitable[Any]]], Any]


def experiments_table(rows: list[ExperimentRow], default_class: str = DEFAULT_CLASS) -> Table:
    """The experiments list, with the dashboard's columns and numbers (an unset priority
    class shown as ``default_class``, the installation's)."""
    table = Table(title="experiments (newest first)")
    # Ids wrap rather than end in '…': the id is what the next command needs.
    table.add_column("id", overflow="fold")
    for col in ("name", "submitted by", "team", "class", "state"):
        table.add_column(col)
    for col in ("done", "running", "queued", "unscored", "total"):
        table.add_column(col, justify="right")
    table.add_column("started")
    table.add_column("duration", justify="right")
    for r in rows:
        p = r.progress
        table.add_row(
            escape(r.experiment_id),
            escape(r.name),
            escape(r.submitted_by),
            escape(r.team or "-"),
            escape(r.class_shown(default_class)),
            p.state,
            *(str(n) for n in (p.done, p.running, p.queued, p.unscored, p.total)),
            when(r.started),
            duration(r.duration_s),
        )
    return table


def status_line(row: ExperimentRow) -> dict[str, Any]:
    """One update of ``status --follow``: the row's progress, rate (trials a minute)
    and ETA (seconds; None while unknown)."""
    rate, eta = rate_and_eta(row)
    return {
        **row.as_dict(),
        "rate_per_min": None if rate is None else round(rate, 3),
        "eta_s": None if eta is None else round(eta, 1),
    }


def status_text(line: dict[str, Any]) -> str:
    """The fields beside the bar: running, queued, unscored, rate, ETA, state."""
    rate = "-" if line["rate_per_min"] is None else f"{line['rate_per_min']:.1f}/min"
    return (
        f"{line['running']} running, {line['queued']} queued, {line['unscored']} unscored, "
        f"{rate}, ETA {duration(line['eta_s'])}, {line['state']}"
    )


def status_table(experiment: str, counts: dict[str, Any]) -> Table:
    """``trialbus status EXP``: the counts, the budget line, and a paused experiment said
    in words with the way out (``trialbus resume``)."""
    title = f"status: {experiment}"
    # At least as wide as its title, which would wrap mid-id in a narrow table.
    table = Table(title=escape(title), min_width=len(title) + 4)
    table.add_column("state")
    table.add_column("trials", justify="right")
    for k, v in counts.items():
        if k == "paused":
            v = f"yes: queued trials wait for `trialbus resume {escape(experiment)}`" if v else "no"
        elif k == "paused_trials":
            v = f"{v}: each waits for `trialbus resume {escape(experiment)} --trial TRIAL`"
        elif k == "team_spend_capped":
            v = "yes: its team reached its max_spend_usd_per_day (`trialbus queue` says more)"
        table.add_row(k, escape(str(v)))
    return table


def runners_table(rows: list[RunnerRow]) -> Table:
    """The runner fleet: one line per live runner record, stale ones marked."""
    table = Table(title="runners", caption="stale: missed a heartbeat (it drops out after its TTL)")
    numbers = ("concurrency", "in flight", "done", "failed")
    table.add_column("id", overflow="fold")
    for col in ("host", "pool", "capabilities", "API keys", *numbers, "last seen", "state"):
        table.add_column(col, justify="right" if col in numbers else "left")
    for r in rows:
        table.add_row(
            escape(r.runner_id),
            escape(r.host),
            escape(r.pool),
            escape(r.offers) or "-",
            escape(r.keys_shown),
            str(r.concurrency),
            *("-" if n is None else str(n) for n in (r.in_flight, r.done, r.failed)),
            f"{when(r.last_seen)} ({duration(r.age_s)} ago)",
            "[red]stale[/red]" if r.stale else "live",
        )
    return table


def queue_tables(view: QueueView) -> list[Table]:
    """``trialbus queue``: per (pool, class, team) what waits, then each experiment and why."""
    groups = Table(title=f"queue: {view.queued} trials wait")
    for col in ("pool", "class", "team"):
        groups.add_column(col)
    for col in ("queued", "running", "experiments"):
        groups.add_column(col, justify="right")
    groups.add_column("queued by reason")
    for g in view.groups:
        reasons = ", ".join(f"{r} {n}" for r, n in g.by_reason.items())
        groups.add_row(
            escape(g.pool),
            escape(g.priority_class),
            escape(g.team or "-"),
            *(str(n) for n in (g.queued, g.running, g.experiments)),
            escape(reasons),
        )
    waiting = Table(title="why they wait")
    waiting.add_column("experiment", overflow="fold")
    for col in ("name", "pool", "class", "team", "queued", "running", "reason"):
        waiting.add_column(col, justify="right" if col in ("queued", "running") else "left")
    waiting.add_column("detail", overflow="fold")
    for e in view.experiments:
        waiting.add_row(
            *(escape(x) for x in (e.experiment_id, e.name, e.pool, e.priority_class)),
            escape(e.team or "-"),
            str(e.queued),
            str(e.running),
            e.reason,
            escape(e.detail),
        )
    return [groups, waiting]


def register(
    app: typer.Typer,
    run: Runner,
    out: Console,
    err: Console,
    write_junit: Callable[[Path, str], None],
) -> None:
    """Add the live commands to the CLI's ``app``; ``run`` maps errors to exit codes,
    ``write_junit(path, experiment)`` writes an experiment's JUnit report."""

    def show_rows[R: ExperimentRow | RunnerRow](
        fetch: Callable[[CommonSettings], Awaitable[list[R]]],
        table: Callable[[list[R]], Table],
        json_out: bool,
    ) -> None:
        """A list command's output: the rows ``fetch`` reads, as JSON or as ``table``."""
        settings = settings_for(CommonSettings)
        rows: list[R] = run(lambda: fetch(settings))
        if json_out:
            out.print_json(json.dumps([r.as_dict() for r in rows]))
        else:
            out.print(table(rows))

    @app.command()
    def status(
        experiment: ExperimentArg,
        json_out: JsonOpt = False,
        follow: Annotated[
            bool,
            typer.Option(
                "--follow", "-f", help="A live progress bar (JSON lines with --json) until it ends."
            ),
        ] = False,
        timeout: Annotated[
            float | None, typer.Option(help="With --follow: give up after this many seconds.")
        ] = None,
    ) -> None:
        """Counts of an experiment's trials by state, and whether it is paused; --follow:
        live until every trial ends."""
        from services.submitter.follow import experiment_status

        if follow:
            raise typer.Exit(follow_status(run, out, experiment, json_out, timeout))
        settings = settings_for(CommonSettings)
        counts, reached = run(lambda: experiment_status(settings, experiment))
        if not reached:
            err.print("warning: NATS is out of reach: whether the experiment is paused is unknown")
        if json_out:
            out.print_json(json.dumps(counts))
            return
        out.print(status_table(experiment, counts))

    @app.command()
    def attach(
        experiment: ExperimentArg,
        json_out: JsonOpt = False,
        timeout: Annotated[
            float | None, typer.Option(help="Give up after this many seconds (exit 4).")
        ] = None,
        junit: JunitOpt = None,
    ) -> None:
        """Follow an experiment started elsewhere (``submit`` without --wait) until it
        ends: its progress as ``status --follow`` and its trials' live log lines from
        now on; the exit code of ``submit --wait`` (0 all scored, 1 some unscored, 4
        timed out)."""
        code = follow_status(run, out, experiment, json_out, timeout, logs=True)
        if junit is not None:
            write_junit(junit, experiment)
        raise typer.Exit(code)

    @app.command()
    def experiments(json_out: JsonOpt = False) -> None:
        """Every experiment: id, name, submitted by, team, class, state, progress, started,
        duration."""
        from services.submitter.follow import list_experiments

        default = settings_for(CommonSettings).default_priority_class
        show_rows(list_experiments, lambda rows: experiments_table(rows, default), json_out)

    @app.command()
    def logs(
        trial: Annotated[str, typer.Argument(help="Trial id.")],
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Keep following until the trial ends.")
        ] = False,
        json_out: JsonOpt = False,
    ) -> None:
        """A trial's live log lines (what the logs stream holds; -f: until it ends)."""
        from services.submitter.follow import LogLine, trial_logs

        def show(line: LogLine) -> None:
            # Printed as it is: a log is the agent's text, never rich markup.
            sys.stdout.write(json.dumps(line.as_dict()) + "\n" if json_out else line.text)
            sys.stdout.flush()

        settings = settings_for(CommonSettings)
        n: int = run(lambda: trial_logs(settings, trial, show, follow=follow))
        if not n and not follow:
            err.print(
                f"no log line of {trial} in the logs stream (it keeps them 2 days; "
                "imported trials have none); a finished trial's own logs are in its stored "
                "folder: the dashboard's trial page, or `trialbus export EXPERIMENT DIR`",
                highlight=False,
            )

    @app.command()
    def runners(json_out: JsonOpt = False) -> None:
        """Live runners: id, host, pool, capabilities, concurrency, last seen; stale marked."""
        from services.submitter.follow import list_runners

        show_rows(list_runners, runners_table, json_out)

    @app.command()
    def queue(json_out: JsonOpt = False) -> None:
        """What waits, per pool, priority class and team, and why: paused, its team at
        its spend cap, no live capable runner, at the experiment's n_concurrent_trials,
        its team over its fair share while another team waits, or behind other work."""
        from services.submitter.follow import list_queue

        settings = settings_for(CommonSettings)
        view: QueueView = run(lambda: list_queue(settings))
        if json_out:
            out.print_json(json.dumps(view.as_dict()))
            return
        if not view.experiments:
            out.print("nothing waits: the work stream holds no queued trial")
            return
        for table in queue_tables(view):
            out.print(table)


def _json_line(obj: dict[str, object]) -> None:
    """One JSON object on a line of stdout, flushed (a follower reads it at once)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def follow_status(
    run: Runner,
    out: Console,
    experiment: str,
    json_out: bool,
    timeout: float | None,
    *,
    logs: bool = False,
) -> int:
    """``status EXP --follow``: a progress bar (JSON lines with --json) until every
    trial is recorded; the exit code of ``submit --wait`` (0, 1 unscored, 4 timeout).
    ``logs`` (``attach``): the trials' live log lines too, each printed as
    ``<trial id> <stream>: <text>`` (with --json, an object with ``"type": "log"``),
    and each failed attempt as ``submit --wait`` prints it (``"type": "failure"``)."""
    from schemas.events import TrialFailed
    from services.submitter.follow import LogLine
    from services.submitter.follow import follow_status as follow_experiment
    from services.submitter.waiting import failure_line

    settings = settings_for(CommonSettings)
    on_line = on_failure = None
    if logs and json_out:

        def on_line(trial_id: str, line: LogLine) -> None:
            _json_line({"type": "log", "trial_id": trial_id, **line.as_dict()})

        def on_failure(ev: TrialFailed) -> None:
            fields = ("trial_id", "attempt", "final", "failure_class", "error_type", "message")
            _json_line({"type": "failure", **ev.model_dump(mode="json", include=set(fields))})

    elif logs:

        def on_line(trial_id: str, line: LogLine) -> None:
            text = line.text.rstrip("\n")
            out.print(f"{trial_id} {line.stream}: {text}", highlight=False, markup=False)

        def on_failure(ev: TrialFailed) -> None:
            out.print(failure_line(ev), highlight=False, markup=False)

    def follow(on_update: Callable[[ExperimentRow], None]) -> Awaitable[ExperimentRow]:
        return follow_experiment(
            settings,
            experiment,
            on_update,
            timeout_s=timeout,
            on_line=on_line,
            on_failure=on_failure,
        )

    if json_out:
        last = run(lambda: follow(lambda row: _json_line(status_line(row))))
    elif out.is_terminal:
        bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=out,
        )
        task = bar.add_task(escape(experiment), total=None, detail="")

        def draw(row: ExperimentRow) -> None:
            line = status_line(row)
            bar.update(task, total=line["total"], completed=line["done"], detail=status_text(line))

        with bar:
            last = run(lambda: follow(draw))
    else:
        seen: list[str] = []

        def say(row: ExperimentRow) -> None:
            line = status_line(row)
            text = f"{line['done']}/{line['total']} done, {status_text(line)}"
            if not seen or seen[-1] != text:
                seen.append(text)
                out.print(f"{experiment} {text}", highlight=False, markup=False)

        last = run(lambda: follow(say))
    p = last.progress
    if not p.finished:
        return E.EXIT_TIMEOUT
    return E.EXIT_OK if p.scored == p.total else E.EXIT_TRIALS_UNSCORED
