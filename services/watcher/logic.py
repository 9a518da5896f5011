"""Pure helpers of the watcher: is an experiment complete; which external jobs are finished."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from schemas.events import ExperimentCompleted
from services.common.folder_reads import MAX_FILE_BYTES, Unread, read_inside
from services.common.harbor_jobs import MARKER
from services.common.ports import Ledger


@dataclass(slots=True)
class RecordTally:
    """An upper bound on an experiment's ledger records, kept from the events seen.

    ``counted`` is the ledger's count at the last exact check, ``since`` the trials
    whose ResultImported arrived after it. Some of those may be counted already, so
    for a watcher that sees every event the sum can only over-estimate: below the
    experiment's size, the experiment is certainly incomplete and the ledger need not
    be asked. Counting on every batch of events cost the ledger a scan of the whole
    experiment per batch (quadratic work; docs/performance.md).
    """

    counted: int | None = None
    since: set[str] = field(default_factory=set)

    def may_be_complete(self, n_trials: int) -> bool:
        """False only when the experiment certainly has fewer than ``n_trials`` records."""
        return self.counted is None or self.counted + len(self.since) >= n_trials

    def reset(self, counted: int) -> None:
        """Start again from an exact count of the ledger."""
        self.counted = counted
        self.since.clear()


async def completion_of(
    ledger: Ledger,
    experiment_id: str,
    correlation_id: str = "",
    tally: RecordTally | None = None,
) -> ExperimentCompleted | None:
    """ExperimentCompleted when every trial of the experiment has a ledger record.

    With a ``tally`` the ledger is counted only when the tally allows completion
    (and the tally is reset to the count); without one, always.
    """
    info = await ledger.get_experiment(experiment_id)
    if info is None:
        return None
    if tally is not None and not tally.may_be_complete(info.n_trials):
        return None
    # Count first (one indexed query): loading every record on each batch of events
    # made the watcher's work grow with the square of the experiment's size.
    counted = await ledger.count_records(experiment_id)
    if tally is not None:
        tally.reset(counted)
    if counted < info.n_trials:
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


def finished_external_jobs(jobs_dir: Path, refused: list[str] | None = None) -> list[Path]:
    """Harbor job folders made outside trialbus whose job has finished.

    Harbor writes the job-level result.json at start and sets ``finished_at`` when
    the job ends; only then are all of its trials final. A result.json that is a
    symbolic link, a FIFO or device, or larger than MAX_FILE_BYTES is not read
    (services.common.folder_reads): its job is left out, and ``refused`` (when given)
    gets one line naming the file and why.
    """
    if not jobs_dir.is_dir():
        return []
    found = []
    for job in sorted(p for p in jobs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if os.path.lexists(job / MARKER):
            # A trialbus job (its trials are announced by the runners), or one whose
            # marker read_marker refuses: importing it would fail on that marker.
            continue
        got = read_inside(job, "result.json", MAX_FILE_BYTES)
        if isinstance(got, Unread):
            if refused is not None and not got.missing:
                refused.append(f"{job / 'result.json'}: {got.reason}")
            continue
        try:
            result = json.loads(got)
        except (ValueError, RecursionError):
            continue  # written while read, or not Harbor's: looked at again next scan
        if isinstance(result, dict) and result.get("finished_at"):
            found.append(job)
    return found
