"""Retrying one finished trial on demand (``trialbus retry``, POST .../retry).

A retry re-publishes the trial's TrialRequested as a NEW run: run id
``<trial_id>:retry:<12 hex>``, fresh each time, so JetStream's dedup window never
swallows it, the runners count its attempts from 1, and its ending is its own. The
request is rebuilt from what the ledger holds: the experiment's stored manifest
(ExperimentInfo.manifest, the same expansion as at submit) and the task's archive in
the tasks bucket, found by ``task_ref``. The ledger then keeps whichever record ranks
higher (services/common/ports.record_order): a retry that completes later replaces
the old record, a retry that fails (a partial record) never erases a complete one.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from pydantic import ValidationError

from schemas.events import TaskRef, TrialRequested
from schemas.manifest import ComputeSpec, ExperimentManifest, StoredTask
from schemas.record import TrialRecord
from services.common.errors import (
    ExperimentCancelled,
    ExperimentNotFound,
    ManifestError,
    UserInputError,
)
from services.common.ports import ExperimentInfo, ObjectStore
from services.common.quotas import QuotaExceeded
from services.submitter.handlers import SubmitterPorts
from services.submitter.quota_gate import QuotaGate
from services.submitter.resolve import TaskFolders
from services.submitter.stored_tasks import read_archive
from services.submitter.submit import expand_trials
from services.submitter.task_needs import TaskNeeds


def stored_manifest(info: ExperimentInfo) -> ExperimentManifest:
    """The manifest as submitted (the ledger's copy, without the reserved ``submitted_by``)."""
    fields = {k: v for k, v in info.manifest.items() if k != "submitted_by"}
    try:
        return ExperimentManifest.model_validate(fields)
    except ValidationError as exc:
        raise ManifestError(
            f"experiment {info.experiment_id!r}: its stored manifest no longer validates "
            f"({exc.error_count()} errors); resubmit it instead"
        ) from None


async def task_ref(
    manifest: ExperimentManifest,
    record: TrialRecord,
    tasks: ObjectStore,
    folders: TaskFolders | None = None,
) -> TaskRef:
    """The archive the trial's task runs from, in this order:

    1. the manifest's ``{name, checksum}`` entry of that name (an uploaded task);
    2. the record's ``provenance.task_archive`` (the archive a runner ran), else its
       ``task_checksum``, when the tasks bucket holds an archive of that name (a
       failure record's is trialbus's; Harbor's result.json carries its own checksum,
       which names no archive; records written before ``task_archive`` have only it);
    3. the manifest's task folder, resolved again on this machine (in ``folders``)
       when its archive is in the bucket: the same content as was run, or the retry
       is refused.
    """
    name = record.provenance.task_name
    for spec in manifest.tasks:
        if isinstance(spec, StoredTask) and spec.name == name:
            return TaskRef(name=name, checksum=spec.checksum)
    for checksum in (record.provenance.task_archive, record.provenance.task_checksum):
        if checksum and await tasks.info(checksum) is not None:
            return TaskRef(name=name, checksum=checksum)
    why = "the task folder changed or is not on this machine"
    if folders is not None:
        try:
            resolved = folders.resolve(manifest)
        except ManifestError as exc:
            # Most often the folder the paths start from: say it, with what is missing.
            resolved = []
            why = f"the manifest's task folders, read from {folders.base_dir}: {exc}"
        for task in resolved:
            if task.ref.name == name and await tasks.info(task.ref.checksum) is not None:
                return task.ref
    raise UserInputError(
        f"task {name!r} of trial {record.trial_id!r}: no archive in the tasks bucket matches "
        f"what the ledger records ({why}); resubmit the manifest to re-run its unscored trials"
    )


async def archive_needs(
    tasks: ObjectStore, ref: TaskRef, compute: ComputeSpec, known: dict[str, TaskNeeds]
) -> TaskNeeds:
    """What the task asks of a runner of ``compute`` (``TrialRequested.task_variables``
    and ``task_requires``), read from its archive in the tasks bucket (unpacked and
    checked against its checksum, as a runner does) and kept in ``known`` by checksum:
    one download per task however many of its trials a request retries."""
    if ref.checksum not in known:
        stored = await tasks.info(ref.checksum)
        data = await tasks.get(stored) if stored is not None else None
        known[ref.checksum] = (
            (await asyncio.to_thread(read_archive, data, ref.checksum, compute))[0]
            if data
            else TaskNeeds()
        )
    return known[ref.checksum]


def recorded_team(info: ExperimentInfo) -> str | None:
    """The team recorded as the experiment's submitter (``submitted_by.team``), or None."""
    by = info.manifest.get("submitted_by")
    team = by.get("team") if isinstance(by, dict) else None
    return team if isinstance(team, str) else None


def retried(trial: TrialRequested) -> TrialRequested:
    """The trial as a new run (its own run id, its own attempts and ending)."""
    return trial.model_copy(update={"run_id": f"{trial.trial_id}:retry:{uuid.uuid4().hex[:12]}"})


async def retry_trial(
    ports: SubmitterPorts,
    experiment_id: str,
    trial_id: str,
    *,
    folders: TaskFolders | None = None,
    team: str | None = None,
) -> dict[str, Any]:
    """Publish a new run of one finished trial; what was published (``retry --json``).

    Raises ExperimentNotFound for an unknown experiment or a trial with no record in
    it (queued or running trials are not retried: they have not finished), and
    ExperimentCancelled in a cancelled experiment (the run would end unstarted).
    ``folders``: where the manifest's task folders are, for a task the ledger names no
    archive of (``task_ref``). With ``ports.quotas``, the run counts against the team
    recorded as the experiment's submitter, else ``team`` (the CLI's), and carries its
    limits like a submission's trials (QuotaExceeded when it would pass).
    """
    info = await _experiment(ports, experiment_id)
    record = await ports.ledger.get_record(trial_id)
    if record is None or record.experiment_id != experiment_id:
        raise ExperimentNotFound(
            f"experiment {experiment_id!r} has no finished trial {trial_id!r} (a queued or "
            "running trial has no record yet; `trialbus status` lists the experiment)"
        )
    await _not_cancelled(ports, experiment_id)
    correlation_id = uuid.uuid4().hex
    run = await _new_run(
        ports, info, stored_manifest(info), record, folders, correlation_id, known={}
    )
    (published,) = await _publish(ports, info, [(record, run)], team)
    # Paused (the experiment, or this trial): the run waits unstarted until resumed.
    paused = await ports.coordinator.is_paused(experiment_id, trial_id=trial_id, fresh=True)
    return {**published, "paused": paused}


async def retry_unscored(
    ports: SubmitterPorts,
    experiment_id: str,
    *,
    folders: TaskFolders | None = None,
    team: str | None = None,
) -> dict[str, Any]:
    """Publish a new run of every finished trial of the experiment that is unscored
    (``retry EXP --unscored``), as ``retry_trial`` does one: from the ledger's copy of
    the manifest and the archives the runners ran, so no manifest file or task folder
    is needed. Every run is built before any is published: a trial that cannot be
    retried refuses the whole request. A quota reached part way says how many went.
    """
    info = await _experiment(ports, experiment_id)
    await _not_cancelled(ports, experiment_id)
    manifest = stored_manifest(info)
    unscored = [r for r in await ports.ledger.records_for(experiment_id) if not r.scored]
    # One correlation id for the request: its runs' imports carry it, as a submission's.
    correlation_id = uuid.uuid4().hex
    known: dict[str, TaskNeeds] = {}
    planned = [
        (r, await _new_run(ports, info, manifest, r, folders, correlation_id, known))
        for r in unscored
    ]
    retried = await _publish(ports, info, planned, team)
    return {
        "experiment_id": experiment_id,
        "correlation_id": correlation_id,
        "n_unscored": len(unscored),
        "retried": retried,
        # Paused: the runs wait unstarted until resumed (one paused trial waits alone).
        "paused": await ports.coordinator.is_paused(experiment_id, fresh=True),
    }


async def _experiment(ports: SubmitterPorts, experiment_id: str) -> ExperimentInfo:
    info = await ports.ledger.get_experiment(experiment_id)
    if info is None:
        raise ExperimentNotFound(f"no experiment {experiment_id!r} in the ledger")
    return info


async def _not_cancelled(ports: SubmitterPorts, experiment_id: str) -> None:
    if await ports.coordinator.is_cancelled(experiment_id, fresh=True):
        raise ExperimentCancelled(
            f"experiment {experiment_id!r} is cancelled: a retry of its trials would end "
            "unstarted as cancelled; resubmit its manifest to lift the cancellation (that "
            "also re-runs its cancelled trials), then retry"
        )


async def _new_run(
    ports: SubmitterPorts,
    info: ExperimentInfo,
    manifest: ExperimentManifest,
    record: TrialRecord,
    folders: TaskFolders | None,
    correlation_id: str,
    known: dict[str, TaskNeeds],
) -> TrialRequested:
    """The recorded trial's TrialRequested, rebuilt from the stored manifest and its
    task's archive (what it asks of a runner too: ``known``, see archive_needs), as a
    new run carrying ``correlation_id``."""
    ref = await task_ref(manifest, record, ports.tasks, folders)
    needs = {ref.checksum: await archive_needs(ports.tasks, ref, manifest.compute, known)}
    matches = [
        t
        for t in expand_trials(manifest, info.experiment_id, [ref], correlation_id, needs)
        if t.trial_id == record.trial_id
    ]
    if not matches:
        raise ManifestError(
            f"trial {record.trial_id!r} is not one of experiment {info.experiment_id!r}'s "
            "trials as its stored manifest expands (was it imported from a job folder?); it "
            "cannot be retried"
        )
    return retried(matches[0])


async def _publish(
    ports: SubmitterPorts,
    info: ExperimentInfo,
    planned: list[tuple[TrialRecord, TrialRequested]],
    team: str | None,
) -> list[dict[str, Any]]:
    """Publish the runs, each counted against the quota of the team recorded as the
    experiment's submitter (else ``team``) and carrying its limits; what was published."""
    owner_team = recorded_team(info) or team
    quota = ports.quotas.for_team(owner_team) if ports.quotas is not None else None
    gate = QuotaGate(ports.coordinator, owner_team, quota) if owner_team and quota else None
    if gate is not None:
        await gate.check_spend()
    published: list[dict[str, Any]] = []
    for record, run in planned:
        if gate is not None:
            try:
                limits = await gate.admit(1)
            except QuotaExceeded as exc:
                if not published:
                    raise
                raise QuotaExceeded(
                    f"{len(published)} of {len(planned)} trials were queued again, then: {exc}"
                ) from None
            if limits is not None:
                run = run.model_copy(update={"team": limits})
        await ports.bus.publish(run)
        published.append(
            {
                "experiment_id": info.experiment_id,
                "trial_id": record.trial_id,
                "run_id": run.dedup_id(),
                "correlation_id": run.correlation_id,
                "previous_status": record.status,
                "previous_scored": record.scored,
            }
        )
    return published
