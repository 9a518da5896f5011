"""The ``trialbus`` commands that steer an experiment's work: ``cancel``, ``pause``,
``resume`` (of an experiment or one trial), ``retry``, and ``quotas`` (publish the
quotas file's limits to the runners; docs/scheduling.md). Thin
like services/cli.py: parse, call services.submitter.commands, print; registered on
the CLI's app by ``register``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from services.cli_args import ExperimentArg, JsonOpt, TrialOpt
from services.common.errors import EXIT_USER_ERROR

type Call = Callable[..., Any]
"""services.cli._call: runs one of services.submitter.commands with the settings."""


def register(
    app: typer.Typer, call: Call, err: Console, printed_as_json: Callable[[Any, bool], bool]
) -> None:
    """Add cancel, pause, resume, retry and quotas to the CLI's ``app``."""

    def set_flag(op: Call, experiment: str, json_out: bool) -> dict[str, Any] | None:
        """Set the experiment's cancel or pause flag through ``op``; the result to say in
        words, or None once printed as JSON. The flag is set even for an experiment the
        ledger does not know yet (its records may not be written yet): a warning says so."""
        result: dict[str, Any] = call(op, experiment)
        if printed_as_json(result, json_out):
            return None
        if not result["known"]:
            err.print(f"warning: the ledger does not know {experiment!r} (yet); flag set anyway")
        return result

    @app.command()
    def cancel(experiment: ExperimentArg, json_out: JsonOpt = False) -> None:
        """Cancel an experiment: queued trials are dropped, running ones stopped."""
        from services.submitter.commands import cancel_experiment

        result = set_flag(cancel_experiment, experiment, json_out)
        if result is None:
            return
        recorded, total = result["already_recorded"], result["n_trials"]
        if total is not None and recorded >= total:
            err.print(
                f"experiment {experiment} cancelled: all {total} trials had finished "
                "already, nothing was stopped; its trials cannot be retried until its "
                "manifest is resubmitted",
                highlight=False,
            )
            return
        err.print(
            f"experiment {experiment} cancelled ({recorded} trials already recorded); "
            "the rest get 'cancelled' records",
            highlight=False,
        )

    @app.command()
    def pause(experiment: ExperimentArg, trial: TrialOpt = None, json_out: JsonOpt = False) -> None:
        """Pause an experiment (or with --trial one trial of it): queued trials wait (not
        started, not lost); running ones finish."""
        from services.submitter.commands import pause_experiment

        if trial is not None:
            result = call(pause_experiment, experiment, trial)
            if printed_as_json(result, json_out):
                return
            if result["already_recorded"]:
                err.print(f"warning: trial {trial} has finished already; a retry of it would wait")
            err.print(
                f"trial {trial} of {experiment} paused: it waits until `trialbus resume "
                f"{experiment} --trial {trial}`; if it is running, it finishes",
                highlight=False,
            )
            return
        result = set_flag(pause_experiment, experiment, json_out)
        if result is None:
            return
        if result["unfinished"] == 0:
            err.print(
                f"experiment {experiment} paused: every trial has a record already; a "
                f"resubmission's or a retry's runs wait until `trialbus resume {experiment}`",
                highlight=False,
            )
            return
        err.print(
            f"experiment {experiment} paused: queued trials wait until `trialbus resume "
            f"{experiment}`; trials already running finish",
            highlight=False,
        )

    @app.command()
    def resume(
        experiment: ExperimentArg, trial: TrialOpt = None, json_out: JsonOpt = False
    ) -> None:
        """Resume a paused experiment (or with --trial one paused trial): its queued
        trials start within seconds."""
        from services.submitter.commands import resume_experiment

        result = call(resume_experiment, experiment, trial)
        if printed_as_json(result, json_out):
            return
        what = f"trial {trial} of {experiment}" if trial else f"experiment {experiment}"
        said = "resumed" if result["was_paused"] else "was not paused; nothing to resume"
        err.print(f"{what} {said}", highlight=False)

    @app.command()
    def quotas(json_out: JsonOpt = False) -> None:
        """Publish the quotas file's limits (TRIALBUS_QUOTAS_FILE) to the runners: a
        changed concurrency or spend quota applies to queued work within seconds."""
        from services.submitter.commands import publish_quotas

        result = call(publish_quotas)
        if printed_as_json(result, json_out):
            return
        n = len(result["limits"]["teams"])
        err.print(
            f"limits of {n} teams (and the default) from {result['quotas_file']} published: "
            "runners apply them to queued and new work",
            highlight=False,
        )

    @app.command()
    def retry(
        experiment: ExperimentArg,
        trial: Annotated[
            str | None,
            typer.Argument(
                help="Trial id (`trialbus trials EXPERIMENT` lists them); or --unscored."
            ),
        ] = None,
        unscored: Annotated[
            bool,
            typer.Option(
                "--unscored",
                help="Every finished trial of the experiment that is unscored, each as a new "
                "run (no manifest file or task folder needed).",
            ),
        ] = False,
        json_out: JsonOpt = False,
        tasks_dir: Annotated[
            Path,
            typer.Option(
                "--from",
                help="Folder the manifest's relative task paths start from (its own folder), "
                "used only when the ledger names no stored archive of the task.",
            ),
        ] = Path("."),
    ) -> None:
        """Run one finished trial again (or with --unscored every unscored one), as a new
        run; its record is replaced by the new run's result if that finishes complete (a
        failed retry keeps the old result)."""
        from services.submitter.commands import retry_trial

        if (trial is None) == (not unscored):
            err.print("error: give a trial id or --unscored (one of the two)")
            raise typer.Exit(EXIT_USER_ERROR)
        result = call(retry_trial, experiment, trial, tasks_dir)
        if printed_as_json(result, json_out):
            return
        runs = result["retried"] if trial is None else [result]
        for run in runs:
            scored = "scored" if run["previous_scored"] else "unscored"
            err.print(
                f"trial {run['trial_id']} queued again as run {run['run_id']} (its record "
                f"was {run['previous_status']}, {scored})",
                highlight=False,
            )
        if trial is None:
            done = f"{len(runs)} unscored trials of {experiment} queued again"
            none = f"{experiment} has no unscored trial: nothing to retry"
            err.print(done if runs else none, highlight=False)
        if result["paused"] and runs:
            also = f" (or `--trial {trial}`)" if trial else ""
            err.print(
                f"they wait unstarted while paused: `trialbus resume {experiment}`{also} "
                "starts them",
                highlight=False,
            )
