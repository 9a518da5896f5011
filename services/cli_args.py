"""The arguments and options several ``trialbus`` commands take, written once so each
reads the same in every command's help."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]

ExperimentArg = Annotated[
    str, typer.Argument(help="Experiment id (`trialbus experiments` lists them).")
]

LatestExperiment = Annotated[str | None, typer.Argument(help="Default: the latest experiment.")]

TrialOpt = Annotated[
    str | None,
    typer.Option("--trial", help="Only this trial of the experiment (its trial id)."),
]
