"""The watcher's decisions: is an experiment complete; which external jobs are new."""

from __future__ import annotations

from pathlib import Path

from schemas.events import ExperimentCompleted
from services.common.harbor_jobs import read_marker
from services.common.ledger import Ledger


async def completion_of(
    ledger: Ledger, experiment_id: str, correlation_id: str = ""
) -> ExperimentCompleted | None:
    """ExperimentCompleted when every trial of the experiment has a ledger record."""
    info = await ledger.get_experiment(experiment_id)
    if info is None:
        return None
    # Count first (one indexed query): loading every record on each batch of events
    # made the watcher's work grow with the square of the experiment's size.
    if await ledger.count_records(experiment_id) < info.n_trials:
        return None
    records = await ledger.records_for(experiment_id)
    if len(records) < info.n_trials:
        return None
    scored = sum(1 for r in records if r.evaluation.reward_valid)
    return ExperimentCompleted(
        experiment_id=experiment_id,
        correlation_id=correlation_id,
        n_trials=info.n_trials,
        n_scored=scored,
        n_partial=sum(1 for r in records if r.status == "partial"),
    )


def finished_external_jobs(jobs_dir: Path) -> list[Path]:
    """Harbor job folders made outside trialbus whose job has finished.

    Harbor writes the job-level result.json at start and sets ``finished_at`` when
    the job ends; only then are all of its trials final.
    """
    import json

    if not jobs_dir.is_dir():
        return []
    found = []
    for job in sorted(p for p in jobs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if read_marker(job) is not None:
            continue  # a trialbus job: its trials are announced by the runners
        try:
            result = json.loads((job / "result.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and result.get("finished_at"):
            found.append(job)
    return found
