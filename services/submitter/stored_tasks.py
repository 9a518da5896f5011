"""Tasks given by checksum (``{name, checksum}``), read at submit as a runner reads them.

A manifest entry that names a task already in the tasks bucket (uploaded with ``POST
/tasks``) brings no folder to the submitter. Before, such tasks were only looked up
(is the archive there?), so their trials carried no ``task_variables`` (a runner
without the task's key took them and ended each) and the local environment's refusals
came from every trial on the runners. Now each such archive is fetched, checked
against its checksum and unpacked into a temporary folder, as a runner does
(``unpack_task``), once per task and submission: what it asks of a runner (its
task.toml's variables; for the local environment, a network allowlist's
``local.allowlist``: services/submitter/task_needs.py) goes into its trials, and for
``compute.environment: local`` what the local environment cannot host is refused like
a folder's (``hosting.local_refusal``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path

from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH, ComputeSpec
from services.common.errors import ManifestError, ObjectCorrupt, ObjectMissing
from services.common.ports import ObjectStore
from services.common.unpack import ArchiveError, unpack_task
from services.localenv.task_fit import unhostable
from services.submitter.hosting import local_refusal
from services.submitter.resolve import ResolvedTask
from services.submitter.submit import PreparedExperiment, check_event_sizes, not_stored
from services.submitter.task_needs import TaskNeeds, task_needs


def read_archive(
    archive: bytes, checksum: str, compute: ComputeSpec
) -> tuple[TaskNeeds, list[str]]:
    """A stored task's (what it asks of a runner of ``compute``, reasons the local
    environment cannot host it: judged for ``compute.environment: local`` only).
    Blocking: unpacks into a temporary folder (ArchiveError for an archive a runner would
    refuse)."""
    local = compute.environment_import_path == LOCAL_ENVIRONMENT_IMPORT_PATH
    with tempfile.TemporaryDirectory(prefix="trialbus-stored-task-") as tmp:
        task_dir = unpack_task(archive, Path(tmp) / "task", checksum)
        refusals = unhostable(task_dir, compute.environment_kwargs) if local else []
        return task_needs(task_dir, compute), refusals


READ_AT_ONCE = 4
"""Stored tasks fetched and unpacked at the same time, at most."""


async def read_stored_tasks(prepared: PreparedExperiment, store: ObjectStore) -> PreparedExperiment:
    """``prepared`` with its stored tasks' variables in their trials. Raises
    ManifestError for a task the bucket does not hold (or holds damaged), an archive a
    runner would refuse to unpack, or, for the local environment, tasks it cannot host
    (the first fault in manifest order; up to ``READ_AT_ONCE`` archives read at once)."""
    compute = prepared.manifest.compute
    stored: dict[str, tuple[int, ResolvedTask]] = {}
    for i, task in enumerate(prepared.tasks):
        if task.folder is None:
            stored.setdefault(task.ref.checksum, (i, task))
    turns = asyncio.Semaphore(READ_AT_ONCE)

    async def read(i: int, task: ResolvedTask) -> tuple[TaskNeeds, list[str]]:
        checksum = task.ref.checksum
        async with turns:
            ref = await store.info(checksum)
            if ref is None:
                raise not_stored(i, task, store.bucket)
            try:
                data = await store.get(ref)
                return await asyncio.to_thread(read_archive, data, checksum, compute)
            except ObjectMissing:
                raise not_stored(i, task, store.bucket, " (any more)") from None
            except (ObjectCorrupt, ArchiveError) as exc:
                raise ManifestError(
                    f"tasks[{i}]: the stored archive of task {task.ref.name!r} "
                    f"({checksum[:12]}...) cannot be used: {exc}; upload the task again"
                ) from None

    answers = await asyncio.gather(
        *(read(i, t) for i, t in stored.values()), return_exceptions=True
    )
    faults = [a for a in answers if isinstance(a, BaseException)]
    if faults:
        raise faults[0]  # the first in manifest order
    read_ok = [a for a in answers if not isinstance(a, BaseException)]
    needs = {checksum: need for checksum, (need, _) in zip(stored, read_ok, strict=True)}
    refused = [
        (task, reasons)
        for (_, task), (_, reasons) in zip(stored.values(), read_ok, strict=True)
        if reasons
    ]
    if refused:
        raise local_refusal(refused, len(prepared.tasks))
    if all(need == TaskNeeds() for need in needs.values()):
        return prepared
    trials = [
        trial.model_copy(update=needs[trial.task.checksum].trial_fields())
        if trial.task.checksum in needs
        else trial
        for trial in prepared.trials
    ]
    updated = dataclasses.replace(prepared, trials=trials)
    check_event_sizes(updated)
    return updated
