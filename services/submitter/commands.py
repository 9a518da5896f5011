"""The CLI's operations (and ``trialbus demo``'s): open what a command needs
(connections.py), call one handler or query, close.

Writes go through ``handlers``; reads are ``services.reports.queries``, run with
``read`` (the same functions the HTTP API calls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Any, Concatenate

from services.common.adapters.nats_objects import open_bucket
from services.common.errors import ManifestError
from services.common.ports import Coordinator, ExperimentInfo, Ledger
from services.common.quotas import QuotaConfigError, Quotas, encode_limits, load_quotas
from services.common.settings import CommonSettings, SubmitterSettings
from services.importer.export import export_experiment
from services.submitter import handlers, trial_pause
from services.submitter.api_tokens import Identity, owner_from_record
from services.submitter.connections import open_ledger, open_nats, try_open_nats
from services.submitter.datasets import fetch_datasets
from services.submitter.handlers import SubmitOutcome, SubmitterPorts
from services.submitter.manifest_io import load_manifest
from services.submitter.resolve import TaskFolders
from services.submitter.submit import PreparedExperiment, prepare
from services.submitter.waiting import EventFeed, Printer


async def prepare_file(
    manifest_path: Path,
    tasks_root: Path | None,
    dataset_cache: Path | None = None,
    progress: Printer | None = None,
) -> PreparedExperiment:
    """Load, resolve and expand a manifest file; task paths are relative to the file,
    its registry datasets are downloaded into ``dataset_cache`` (services/submitter/
    datasets.py; a line each to ``progress``).

    Every ManifestError names the file.
    """
    manifest = load_manifest(manifest_path)
    base_dir = manifest_path.resolve().parent
    say = None if progress is None else partial(progress.print, highlight=False, markup=False)
    try:
        datasets = await fetch_datasets(manifest, base_dir, dataset_cache, say)
        return prepare(manifest, base_dir, tasks_root, datasets)
    except ManifestError as exc:  # name the file, as load_manifest's errors do
        raise ManifestError(f"{manifest_path}: {exc}") from None


def cli_submitter(
    prepared: PreparedExperiment, info: ExperimentInfo | None, cli_team: str | None
) -> PreparedExperiment:
    """``prepared`` as the CLI submits it: recorded (``submitted_by``) and held to its
    quotas exactly as an API token's team would be.

    The CLI has no token: its identity is the operator's ``TRIALBUS_CLI_TEAM`` (unset:
    nobody, no team), never the manifest. Whoever runs it holds the submitter's bus
    credentials, so it acts as an admin token does: resubmitting an experiment whose
    ledger copy (``info``) names an owner keeps that owner and its team, so ownership
    and quotas do not move with whoever resubmits.
    """
    owner = owner_from_record(info.manifest.get("submitted_by")) if info else None
    by = (owner or Identity(team=cli_team)).record()
    team = by.get("team") if by else None
    return dataclasses.replace(prepared, submitted_by=by, team=team)


async def held_to(coordinator: Coordinator, own: Quotas | None) -> Quotas | None:
    """The team quotas a CLI submission or retry is held to: its own
    ``TRIALBUS_QUOTAS_FILE``'s when set (``submit`` then publishes them), else those the
    stack's submitter last published (``quota.limits``). So ``trialbus submit`` under
    ``TRIALBUS_CLI_TEAM`` counts against the operator's quotas without a copy of their
    file, as an API token's team does; None when neither exists."""
    return own if own is not None else await coordinator.team_limits(fresh=True)


NOT_CHECKED_OFFLINE = (
    "whether a live runner of the pool offers what it requires, ships its agents and has "
    "its variables set, the owner of an experiment of that id, the team's quotas, the "
    "tasks given by checksum being in the tasks bucket (submit checks them against the "
    "stack)"
)


async def _checked_file(
    settings: SubmitterSettings, manifest_path: Path, progress: Printer | None
) -> tuple[PreparedExperiment, Quotas | None]:
    """What ``submit`` checks before connecting: the manifest and its task folders, its
    priority class, the quotas file (each error names its file)."""
    prepared = await prepare_file(
        manifest_path, settings.tasks_root, settings.dataset_cache, progress
    )
    try:
        handlers.check_priority_class(prepared, settings.classes)
    except ManifestError as exc:
        raise ManifestError(f"{manifest_path}: {exc}") from None
    quotas = load_quotas(settings.quotas_file) if settings.quotas_file is not None else None
    return prepared, quotas


async def plan_submission(
    settings: SubmitterSettings, manifest_path: Path, progress: Printer | None = None
) -> dict[str, Any]:
    """``trialbus submit --dry-run``: what a submission would publish
    (``PreparedExperiment.plan``), checked as ``submit`` checks it before it changes
    anything: against the stack when NATS answers (``handlers.dry_run``), else as far
    as it can be without it (``_checked_file``), saying what was not checked. Nothing
    is uploaded or published. ``stack``: whether the stack was asked."""
    prepared, quotas = await _checked_file(settings, manifest_path, progress)
    prepared = cli_submitter(prepared, None, settings.cli_team)
    async with try_open_nats(settings, "trialbus-dry-run") as nats:
        if nats is None:
            return {**prepared.plan(), "stack": False, "not_checked": NOT_CHECKED_OFFLINE}
        async with open_ledger(settings) as ledger:
            info = await ledger.get_experiment(prepared.experiment_id)
            prepared = cli_submitter(prepared, info, settings.cli_team)
            held = await held_to(await nats.coordinator(), quotas)
            ports = await nats.ports_for(ledger, held, SubmitterPorts)
            return {**await handlers.dry_run(prepared, ports), "stack": True}


async def submit_and_wait(
    settings: SubmitterSettings,
    manifest_path: Path,
    *,
    wait: bool,
    timeout_s: float,
    progress: Printer | None,
) -> SubmitOutcome:
    """``trialbus submit [--wait]``: a bad manifest is refused before connecting."""
    prepared, quotas = await _checked_file(settings, manifest_path, progress)
    prepared = cli_submitter(prepared, None, settings.cli_team)
    async with open_nats(settings, "trialbus-submit") as nats, open_ledger(settings) as ledger:
        info = await ledger.get_experiment(prepared.experiment_id)
        prepared = cli_submitter(prepared, info, settings.cli_team)
        coordinator = await nats.coordinator()
        if quotas is not None:  # the file's limits reach the queued work too
            await coordinator.set_team_limits(quotas)
        quotas = await held_to(coordinator, quotas)
        # Subscribed before publishing, so no completion can slip past.
        feeds: AbstractAsyncContextManager[EventFeed | None] = (
            nats.events_of(prepared.experiment_id) if wait else contextlib.nullcontext()
        )
        async with feeds as feed:
            ports = await nats.ports_for(ledger, quotas, SubmitterPorts)
            return await handlers.submit_and_wait(
                prepared, ports, feed, timeout_s=timeout_s, progress=progress
            )


async def publish_quotas(settings: CommonSettings) -> dict[str, Any]:
    """``trialbus quotas``: read ``TRIALBUS_QUOTAS_FILE`` and publish the limits runners
    enforce (``quota.limits``): a changed concurrency or spend quota then applies to
    work already queued, within about a second, without resubmitting it."""
    sub = SubmitterSettings(**settings.model_dump())
    if sub.quotas_file is None:
        raise QuotaConfigError(
            "TRIALBUS_QUOTAS_FILE is not set: name the quotas file whose limits to publish"
        )
    quotas = load_quotas(sub.quotas_file)
    async with open_nats(settings, "trialbus-quotas") as nats:
        await (await nats.coordinator()).set_team_limits(quotas)
    return {
        "quotas_file": str(sub.quotas_file),
        "limits": json.loads(encode_limits(quotas)),
    }


async def cancel_experiment(settings: CommonSettings, experiment_id: str) -> dict[str, Any]:
    """``trialbus cancel`` (see handlers.cancel)."""
    async with open_nats(settings, "trialbus-cancel") as nats, open_ledger(settings) as ledger:
        return await handlers.cancel(ledger, await nats.coordinator(), experiment_id)


async def pause_experiment(
    settings: CommonSettings, experiment_id: str, trial_id: str | None = None
) -> dict[str, Any]:
    """``trialbus pause`` (see handlers.pause; with ``trial_id``, trial_pause.pause_trial)."""
    return await _hold(settings, experiment_id, trial_id, pause=True)


async def resume_experiment(
    settings: CommonSettings, experiment_id: str, trial_id: str | None = None
) -> dict[str, Any]:
    """``trialbus resume`` (see handlers.resume; with ``trial_id``, trial_pause.resume_trial)."""
    return await _hold(settings, experiment_id, trial_id, pause=False)


async def _hold(
    settings: CommonSettings, experiment_id: str, trial_id: str | None, *, pause: bool
) -> dict[str, Any]:
    # Pause and resume open the same connections and differ only in the handler called.
    verb = "pause" if pause else "resume"
    async with open_nats(settings, f"trialbus-{verb}") as nats, open_ledger(settings) as ledger:
        coordinator = await nats.coordinator()
        if trial_id is not None:
            one = trial_pause.pause_trial if pause else trial_pause.resume_trial
            return await one(ledger, coordinator, experiment_id, trial_id)
        every = handlers.pause if pause else handlers.resume
        return await every(ledger, coordinator, experiment_id)


async def retry_trial(
    settings: CommonSettings, experiment_id: str, trial_id: str | None, base_dir: Path
) -> dict[str, Any]:
    """``trialbus retry`` of one trial, or with ``trial_id`` None of every unscored one
    (``--unscored``; see services.submitter.retry). ``base_dir``: where the manifest's
    relative task folders are, when the ledger names no stored archive."""
    from services.submitter import retry

    # The quota settings are the submitter's (the CLI's steering commands get the common
    # ones): read once here, as `submit` does.
    sub = SubmitterSettings(**settings.model_dump())
    quotas = load_quotas(sub.quotas_file) if sub.quotas_file is not None else None
    async with open_nats(settings, "trialbus-retry") as nats, open_ledger(settings) as ledger:
        tasks, coordinator = await nats.tasks(), await nats.coordinator()
        quotas = await held_to(coordinator, quotas)
        ports = SubmitterPorts(nats.bus, ledger, coordinator, tasks, quotas=quotas)
        folders, team = TaskFolders(base_dir), sub.cli_team
        if trial_id is None:
            return await retry.retry_unscored(ports, experiment_id, folders=folders, team=team)
        return await retry.retry_trial(ports, experiment_id, trial_id, folders=folders, team=team)


async def import_job(
    settings: CommonSettings, job_dir: Path, *, as_new: bool = False
) -> dict[str, Any]:
    """``trialbus import`` (see handlers.import_job): announced when NATS is reachable,
    ledgered alone when it is not."""
    handlers.check_job_dir(job_dir)  # before the NATS probe, which may take seconds
    async with (
        open_ledger(settings) as ledger,
        try_open_nats(settings, "trialbus-import") as nats,
    ):
        return await handlers.import_job(ledger, nats.bus if nats else None, job_dir, as_new=as_new)


async def export_job(settings: CommonSettings, experiment_id: str, dest: Path) -> dict[str, Any]:
    """``trialbus export``: the experiment's Harbor job folder, from ledger and bucket."""
    async with open_nats(settings, "trialbus-export") as nats, open_ledger(settings) as ledger:
        results = await open_bucket(nats.nc.jetstream(), settings, "results")
        summary = await export_experiment(ledger, results, experiment_id, dest)
    return summary.as_dict()


async def read[**P, T](
    settings: CommonSettings,
    query: Callable[Concatenate[Ledger, P], Awaitable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run one of services.reports.queries against the ledger."""
    async with open_ledger(settings) as ledger:
        return await query(ledger, *args, **kwargs)
