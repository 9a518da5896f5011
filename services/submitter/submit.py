"""Expanding a manifest into trials and publishing them.

Before any trial is published, the archive of every task goes to the tasks bucket
(named by its checksum: a task already there is not uploaded again), so a runner on
any machine can fetch what a TrialRequested names. Publishing is idempotent twice
over: each TrialRequested carries its trial_id as the JetStream dedup id (a CI retry
within the dedup window publishes nothing new), and trials the ledger already scored
are not published again at all (resume).

Every event is encoded and measured before anything is uploaded or published
(``check_event_sizes``): consumers terminate an event over MAX_EVENT_BYTES as
poison, so an oversized manifest field would otherwise make trials vanish.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from schemas.events import (
    MAX_EVENT_BYTES,
    ExperimentSubmitted,
    TaskRef,
    TeamRef,
    TrialRequested,
    encode_event,
)
from schemas.ids import experiment_id_for, trial_id_for
from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH, ExperimentManifest
from services.common.errors import ManifestError
from services.common.pools import required_capabilities, trial_capabilities
from services.common.ports import EventBus, Ledger, ObjectStore
from services.common.task_cache import upload_task
from services.reports.formatting import agent_at
from services.submitter.datasets import FetchedDatasets
from services.submitter.hosting import check_local_hosting
from services.submitter.quota_gate import QuotaGate
from services.submitter.resolve import ResolvedTask, resolve_tasks
from services.submitter.task_needs import TaskNeeds, task_needs


def canonical_manifest(manifest: ExperimentManifest) -> dict[str, Any]:
    """The manifest as stored and hashed (JSON types, no experiment_id)."""
    return manifest.model_dump(mode="json", exclude={"experiment_id"})


def experiment_id_of(manifest: ExperimentManifest) -> str:
    """The manifest's experiment id, or one derived from its content. The budget is left
    out: raising it and resubmitting must go on with the same experiment."""
    content = manifest.model_dump(mode="json", exclude={"experiment_id", "budget"})
    return manifest.experiment_id or experiment_id_for(manifest.name, content)


def expand_trials(
    manifest: ExperimentManifest,
    experiment_id: str,
    tasks: list[TaskRef],
    correlation_id: str = "",
    needs: Mapping[str, TaskNeeds] | None = None,
) -> list[TrialRequested]:
    """tasks x agents x repetitions, in a stable order. ``needs``: by task checksum, what
    the task asks of a runner (each trial carries its task's; a task not in it, none)."""
    nothing = TaskNeeds()
    trials: list[TrialRequested] = []
    n_trials = len(manifest.agents) * len(tasks) * manifest.repetitions
    for agent in manifest.agents:
        for task in tasks:
            for rep in range(manifest.repetitions):
                trial_id = trial_id_for(
                    experiment_id, task.name, agent.agent_ref, agent.model, agent.kwargs, rep
                )
                trials.append(
                    TrialRequested(
                        experiment_id=experiment_id,
                        trial_id=trial_id,
                        correlation_id=correlation_id,
                        task=task,
                        agent=agent,
                        repetition=rep,
                        compute=manifest.compute,
                        retry=manifest.retry,
                        experiment_trials=n_trials,
                        **(needs or {}).get(task.checksum, nothing).trial_fields(),
                    )
                )
    return trials


_ID_LISTS = frozenset({"trial_ids", "published_ids"})
"""``SubmitResult``'s fields its JSON form leaves out."""


@dataclass(slots=True)
class SubmitResult:
    """What a submission did."""

    experiment_id: str
    name: str
    n_trials: int
    n_published: int = 0
    n_duplicates: int = 0
    n_already_scored: int = 0
    correlation_id: str = ""
    trial_ids: list[str] = field(default_factory=list)
    published_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``submit --json``, ``POST /experiments``): every field but the
        trial id lists (one id per trial: thousands in a large experiment)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _ID_LISTS}


@dataclass(frozen=True, slots=True)
class PreparedExperiment:
    """A validated, resolved and expanded manifest, ready to publish."""

    manifest: ExperimentManifest
    experiment_id: str
    tasks: list[ResolvedTask]
    trials: list[TrialRequested]
    correlation_id: str
    submitted_by: dict[str, str] | None = None
    """Who submitted it (``api_tokens.Identity.record``): the API token's identity, or
    for the CLI ``{"team": TRIALBUS_CLI_TEAM}`` (commands.cli_submitter); stored in
    the ledger's copy of the manifest under the reserved key ``submitted_by``, which
    no manifest can carry itself (unknown fields are refused). None: not recorded."""
    team: str | None = None
    """The team whose quotas apply: ``submitted_by``'s team (the token's, or the CLI's
    ``TRIALBUS_CLI_TEAM``); never read from the manifest. None: no team, no quota."""

    def plan(self) -> dict[str, Any]:
        """What it would run, as a dry run says it: the experiment id, the trial count,
        tasks, agents (as reports name them), the pool and what its runners must offer
        (the compute's requirements, then what tasks require), and the variables the
        runners must have set (the agents' ``api_key_env`` and what a task's task.toml
        asks for)."""
        manifest = self.manifest
        variables = {name for trial in self.trials for name in trial.needed_variables()}
        requires = {c: None for trial in self.trials for c in trial_capabilities(trial)}
        agents = {agent_at(t.agent.display, t.agent.model): None for t in self.trials}
        return {
            "dry_run": True,
            "experiment_id": self.experiment_id,
            "name": manifest.name,
            "n_trials": len(self.trials),
            "tasks": [t.ref.name for t in self.tasks],
            "agents": list(agents),
            "repetitions": manifest.repetitions,
            "pool": manifest.compute.pool,
            "requires": list(dict.fromkeys([*required_capabilities(manifest.compute), *requires])),
            "runner_variables": sorted(variables),
        }


def prepare(
    manifest: ExperimentManifest,
    base_dir: Path,
    tasks_root: Path | None = None,
    datasets: FetchedDatasets | None = None,
) -> PreparedExperiment:
    """Resolve tasks (a dataset entry's folders: ``datasets``) and expand trials
    (raises ManifestError on bad input, an event too large included)."""
    experiment_id = experiment_id_of(manifest)
    tasks = resolve_tasks(manifest, base_dir, tasks_root, datasets)
    compute = manifest.compute
    if compute.environment_import_path == LOCAL_ENVIRONMENT_IMPORT_PATH:
        check_local_hosting(tasks, compute.environment_kwargs)
    correlation_id = uuid.uuid4().hex
    # Read here, where the folders are: a runner lacking one hands the trial on.
    needs = {t.ref.checksum: task_needs(t.folder, compute) for t in tasks if t.folder is not None}
    trials = expand_trials(manifest, experiment_id, [t.ref for t in tasks], correlation_id, needs)
    prepared = PreparedExperiment(manifest, experiment_id, tasks, trials, correlation_id)
    # Here too, so the CLI refuses before connecting and names the manifest file.
    check_event_sizes(prepared)
    return prepared


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _largest_field(value: Any, path: str) -> tuple[str, int]:
    """The path of the largest leaf under ``value`` (descending into the largest
    child each time) and that leaf's encoded size."""
    while isinstance(value, dict | list) and value:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        key, value = max(items, key=lambda kv: _json_size(kv[1]))
        path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
    return path, _json_size(value)


def _too_large(kind: str, data: bytes, field: str, field_bytes: int) -> ManifestError:
    return ManifestError(
        f"{field}: {field_bytes} bytes make the {kind} event {len(data)} bytes, over the "
        f"{MAX_EVENT_BYTES}-byte limit of an event (every consumer would drop it as "
        f"poison); shorten {field}, or put long text in the task's files"
    )


TEAM_REF_MAX_BYTES = len(',"team":') + len(
    TeamRef(
        name="x" * 64, max_concurrent_trials=2**63 - 1, max_spend_usd_per_day=sys.float_info.max
    ).model_dump_json()
)
"""The most a TrialRequested's ``team`` adds to its encoding."""


def _longest_run_id(trial: TrialRequested) -> str:
    return f"{trial.trial_id}:resume:{'0' * 12}"


def longest_size(trial: TrialRequested) -> int:
    """Bytes of ``trial`` in the longest form it is published in (a resumed run's id).

    Ids need no JSON escaping, so that is its encoding plus the run id's growth: one
    encoding per trial, where a copy of each of 10,000 trials cost a second."""
    return len(encode_event(trial)) + len(_longest_run_id(trial)) - len(trial.run_id)


def experiment_submitted(prepared: PreparedExperiment, n_published: int) -> ExperimentSubmitted:
    """The experiment's ExperimentSubmitted: the manifest as stored (canonical, with the
    experiment id and ``submitted_by``) and how many trials this submission publishes."""
    manifest = canonical_manifest(prepared.manifest)
    manifest["experiment_id"] = prepared.experiment_id
    if prepared.submitted_by is not None:
        manifest["submitted_by"] = dict(prepared.submitted_by)
    return ExperimentSubmitted(
        experiment_id=prepared.experiment_id,
        correlation_id=prepared.correlation_id,
        name=prepared.manifest.name,
        n_trials=len(prepared.trials),
        n_published=n_published,
        manifest=manifest,
    )


def check_event_sizes(prepared: PreparedExperiment) -> None:
    """Raise ManifestError naming the field when an event of ``prepared`` would be too
    large for its consumers (MAX_EVENT_BYTES), measured in the largest form each takes
    (a resumed trial's run id; the manifest as stored, ``submitted_by`` included)."""
    submitted = experiment_submitted(prepared, len(prepared.trials))
    data = encode_event(submitted)
    if len(data) > MAX_EVENT_BYTES:
        raise _too_large("experiment_submitted", data, *_largest_field(submitted.manifest, ""))
    agents = prepared.manifest.agents
    # A team's work messages carry its TeamRef, added at publish time.
    reserve = TEAM_REF_MAX_BYTES if prepared.team is not None else 0
    for trial in prepared.trials:
        # The resume form of the run id is the longest a trial is published with.
        if longest_size(trial) + reserve <= MAX_EVENT_BYTES:
            continue
        data = encode_event(trial.model_copy(update={"run_id": _longest_run_id(trial)}))
        fields = trial.model_dump(mode="json")
        top, _ = _largest_field(fields, "")
        top = top.split(".")[0].split("[")[0]
        where = {
            "agent": f"agents[{agents.index(trial.agent)}]",
            "compute": "compute",
            "retry": "retry",
        }.get(top, f"trial_requested.{top}")
        raise _too_large("trial_requested", data, *_largest_field(fields[top], where))


def not_stored(i: int, task: ResolvedTask, bucket: str, why: str = "") -> ManifestError:
    """The refusal of ``tasks[i]``, a task given by checksum the bucket does not hold."""
    return ManifestError(
        f"tasks[{i}]: task {task.ref.name!r} ({task.ref.checksum[:12]}...) is not in the "
        f"tasks bucket {bucket}{why}; upload it first (POST /tasks)"
    )


async def check_stored_tasks(prepared: PreparedExperiment, store: ObjectStore) -> None:
    """Raise ManifestError naming a task given by checksum (``{name, checksum}``) that
    the tasks bucket does not hold: its trials would fail on every runner."""
    for i, task in enumerate(prepared.tasks):
        if task.folder is None and await store.info(task.ref.checksum) is None:
            raise not_stored(i, task, store.bucket)


async def upload_tasks(prepared: PreparedExperiment, store: ObjectStore) -> None:
    """Store every task's archive the bucket lacks (``check_stored_tasks`` first).

    Raises ArchiveError (a UserInputError naming the entry) for a folder the runners
    would refuse to unpack, before anything of the experiment is published.
    """
    await check_stored_tasks(prepared, store)
    for task in prepared.tasks:
        if task.folder is None:
            continue
        ref = await upload_task(store, task.folder)
        if ref.name != task.ref.checksum:
            # The folder changed between resolving and packing: its trials would name
            # an archive that is not the one stored.
            raise ManifestError(
                f"task folder {task.folder} changed while it was submitted; submit again"
            )


async def publish_experiment(
    prepared: PreparedExperiment,
    bus: EventBus,
    ledger: Ledger | None,
    tasks: ObjectStore,
    gate: QuotaGate | None = None,
) -> SubmitResult:
    """Upload the tasks, publish ExperimentSubmitted, then every trial still to run.

    Raises ManifestError before anything is uploaded or published when an event
    would be too large (``check_event_sizes``, again: ``submitted_by`` is added to
    the manifest after ``prepare``), and QuotaExceeded before anything is published
    when the trials still to run would pass the team's quota (``gate``)."""
    check_event_sizes(prepared)
    await upload_tasks(prepared, tasks)
    scored: set[str] = set()
    unscored_versions: dict[str, str] = {}
    if ledger is not None:
        scored = await ledger.scored_trial_ids(prepared.experiment_id)
        for rec in await ledger.records_for(prepared.experiment_id):
            if rec.trial_id not in scored:
                digest = hashlib.sha256(rec.model_dump_json().encode()).hexdigest()
                unscored_versions[rec.trial_id] = digest[:12]
    todo = [t for t in prepared.trials if t.trial_id not in scored]
    result = SubmitResult(
        experiment_id=prepared.experiment_id,
        name=prepared.manifest.name,
        n_trials=len(prepared.trials),
        n_already_scored=len(prepared.trials) - len(todo),
        correlation_id=prepared.correlation_id,
        trial_ids=[t.trial_id for t in prepared.trials],
    )
    team = await gate.admit(len(todo)) if gate is not None else None
    await bus.publish(experiment_submitted(prepared, len(todo)))
    items: list[TrialRequested] = []
    for t in todo:
        update: dict[str, object] = {"team": team} if team is not None else {}
        # A trial with an unscored record is re-run under a msg id derived from that
        # record: concurrent resubmissions agree (and dedupe), a later one re-runs.
        if t.trial_id in unscored_versions:
            update["run_id"] = f"{t.trial_id}:resume:{unscored_versions[t.trial_id]}"
        items.append(t.model_copy(update=update) if update else t)
    fresh = await bus.publish_many(items)
    result.published_ids = [t.trial_id for t, new in zip(todo, fresh, strict=True) if new]
    result.n_published = len(result.published_ids)
    result.n_duplicates = len(items) - result.n_published
    if gate is not None:
        await gate.give_back(result.n_duplicates)
    return result
