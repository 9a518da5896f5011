"""``trialbus export EXP DIR``: a Harbor job folder of an experiment, from anywhere.

Built from what every machine with the credentials can reach: the ledger's records
(which trials, and the ObjectRef of each stored trial folder) and the results bucket
(the folders themselves, verified against the reference). The folder is the one the
importer keeps, written under ``DIR/<experiment_id>/``: one Harbor trial folder per
trial, the job's config.json, trialbus's marker and Harbor's job-level result.json,
so ``harbor view DIR`` opens it. Records without a stored folder (partial records of
trials that never produced one, or trials imported from a job folder) are counted,
not invented.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.common.errors import ExperimentNotFound, ObjectCorrupt, ObjectMissing
from services.common.harbor_jobs import job_dir_for, write_job_result
from services.common.ports import Ledger, ObjectStore
from services.common.unpack import ArchiveError
from services.importer.folders import place_trial


@dataclass(slots=True)
class ExportSummary:
    """What an export wrote (``trialbus export --json``)."""

    experiment_id: str
    job_dir: str
    """The Harbor job folder written: ``<dest>/<experiment_id>``."""
    trials: int = 0
    """Records the ledger holds for the experiment."""
    written: int = 0
    """Trial folders written into the job folder."""
    bytes_fetched: int = 0
    """Archive bytes read from the results bucket."""
    without_folder: list[str] = field(default_factory=list)
    """Trials whose record names no archive (an attempt that left no folder, or a record
    imported from a job folder): nothing to write."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """Trial id -> why its archive could not be had (missing, corrupt, unsafe to unpack)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``--json``)."""
        return asdict(self)


async def export_experiment(
    ledger: Ledger, results: ObjectStore, experiment_id: str, dest: Path
) -> ExportSummary:
    """Write the experiment's job folder under ``dest``; raises ExperimentNotFound."""
    records = await ledger.records_for(experiment_id)
    info = await ledger.get_experiment(experiment_id)
    if not records and info is None:
        raise ExperimentNotFound(f"experiment {experiment_id!r} is not in the ledger")
    summary = ExportSummary(experiment_id, str(job_dir_for(dest, experiment_id)), len(records))
    for record in sorted(records, key=lambda r: r.trial_id):
        ref = record.artifacts.archive
        if ref is None:
            summary.without_folder.append(record.trial_id)
            continue
        try:
            data = await results.get(ref)
            await asyncio.to_thread(place_trial, dest, experiment_id, record.trial_id, data)
        except (ObjectMissing, ObjectCorrupt, ArchiveError) as exc:
            summary.unavailable[record.trial_id] = f"{type(exc).__name__}: {exc}"
            continue
        summary.written += 1
        summary.bytes_fetched += ref.size
    n_total = info.n_trials if info is not None else len(records)
    await asyncio.to_thread(
        write_job_result, job_dir_for(dest, experiment_id), experiment_id, n_total
    )
    return summary
