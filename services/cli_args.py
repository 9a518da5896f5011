"""The arguments and options several ``trialbus`` commands take, written once so each
reads the same in every command's help."""

from __future__ import annotations

from pathlib import Path
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

JunitOpt = Annotated[
    Path | None,
    typer.Option(
        "--junit",
        help="Also write the finished trials as a JUnit XML report (CI test reports): a "
        "test case per trial; a reward below a pass is a failure, an unscored trial an error.",
    ),
]
