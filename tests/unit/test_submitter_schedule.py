"""Pause, resume and retry on the submitter's side (services.submitter.handlers and
services.submitter.retry) against the in-memory fakes; the runner's side of a pause is
tests/unit/test_runner_pause.py, both together with real processes
tests/e2e/test_pause_retry.py."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schemas.events import TrialRequested
from schemas.manifest import ExperimentManifest
from schemas.record import PhaseTiming, Provenance, TrialRecord
from services.common.adapters.memory import InMemoryCoordinator, InMemoryLedger, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.errors import ExperimentCancelled, ExperimentNotFound, UserInputError
from services.common.ports import ExperimentInfo
from services.reports import queries
from services.submitter import handlers
from services.submitter.handlers import SubmitterPorts
from services.submitter.resolve import TaskFolders
from services.submitter.retry import retry_trial, retry_unscored
from services.submitter.submit import PreparedExperiment, canonical_manifest, prepare
from tests.support.records import single_reward

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"
HARBOR_CHECKSUM = "ab" * 32  # Harbor's own task checksum: names no archive
T0 = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


async def test_pause_and_resume_flag_the_experiment() -> None:
    ledger, coord = InMemoryLedger(), InMemoryCoordinator(lease_ttl_s=60)
    paused = await handlers.pause(ledger, coord, "exp-1")
    assert paused == {
        "experiment_id": "exp-1",
        "paused": True,
        "known": False,
        "unfinished": None,
    }
    assert await coord.is_paused("exp-1") and not await coord.is_paused("exp-2")
    resumed = await handlers.resume(ledger, coord, "exp-1")
    assert (resumed["paused"], resumed["was_paused"]) == (False, True)
    assert not await coord.is_paused("exp-1")
    # Negative control: resuming what was not paused says so.
    assert (await handlers.resume(ledger, coord, "exp-1"))["was_paused"] is False


async def test_a_resubmission_does_not_lift_a_pause() -> None:
    prepared = _prepared()
    coord = InMemoryCoordinator(lease_ttl_s=60)
    await coord.pause(prepared.experiment_id)
    await coord.cancel(prepared.experiment_id)
    tasks = InMemoryObjectStore("TASKS")
    await handlers.submit(prepared, SubmitterPorts(RecordingBus(), InMemoryLedger(), coord, tasks))
    assert await coord.is_paused(prepared.experiment_id)
    assert not await coord.is_cancelled(prepared.experiment_id)  # the control: it lifts this


def _prepared() -> PreparedExperiment:
    manifest = ExperimentManifest.model_validate(
        {"name": "unit", "tasks": ["hello-file"], "agents": [{"name": "oracle"}], "repetitions": 2}
    )
    return prepare(manifest, TASKS)


def _record(
    trial: TrialRequested, checksum: str, *, finished: datetime, reward: float | None
) -> TrialRecord:
    return TrialRecord(
        trial_id=trial.trial_id,
        experiment_id=trial.experiment_id,
        status="complete" if reward is not None else "partial",
        attempts=1,
        provenance=Provenance(
            task_name=trial.task.name, task_checksum=checksum, agent_name="oracle"
        ),
        timing=PhaseTiming(started_at=finished - timedelta(seconds=5), finished_at=finished),
        evaluation=single_reward(reward),
    )


async def _submitted(
    checksum: str | None = None,
    rewards: tuple[float | None, float | None] = (1.0, 1.0),
    prepared: PreparedExperiment | None = None,
) -> tuple[PreparedExperiment, SubmitterPorts, InMemoryLedger, RecordingBus]:
    """An experiment (``prepared``, default ``_prepared()``: two trials) submitted (its
    task archive stored) and both trials recorded with ``rewards`` (None: unscored);
    the ports it was submitted with (a retry's), and its ledger and bus."""
    prepared = prepared or _prepared()
    ledger, bus, tasks = InMemoryLedger(), RecordingBus(), InMemoryObjectStore("TASKS")
    ports = SubmitterPorts(bus, ledger, InMemoryCoordinator(lease_ttl_s=60), tasks)
    await handlers.submit(prepared, ports)
    manifest = canonical_manifest(prepared.manifest)
    manifest |= {"experiment_id": prepared.experiment_id, "submitted_by": {"user": "alice"}}
    await ledger.upsert_experiment(ExperimentInfo(prepared.experiment_id, "unit", 2, manifest))
    records = [
        _record(t, checksum or t.task.checksum, finished=T0, reward=reward)
        for t, reward in zip(prepared.trials, rewards, strict=True)
    ]
    await ledger.upsert_records(records)
    bus.published.clear()
    return prepared, ports, ledger, bus


async def test_a_retry_publishes_the_same_trial_as_a_new_run_each_time() -> None:
    prepared, ports, _, bus = await _submitted()
    trial = prepared.trials[1]
    first = await retry_trial(ports, prepared.experiment_id, trial.trial_id)
    second = await retry_trial(ports, prepared.experiment_id, trial.trial_id)
    runs = bus.of_type(TrialRequested)
    assert [r.trial_id for r in runs] == [trial.trial_id] * 2
    assert first["run_id"] != second["run_id"]
    assert all(r.run_id.startswith(f"{trial.trial_id}:retry:") for r in runs)
    assert first["previous_scored"] is True
    # Everything but the run and correlation ids is what was submitted.
    ignore = {"run_id", "correlation_id", "event_id", "occurred_at"}
    assert runs[0].model_dump(exclude=ignore) == trial.model_dump(exclude=ignore)
    # The other trial is untouched.
    assert prepared.trials[0].trial_id not in {r.trial_id for r in runs}


async def test_a_retry_names_the_variables_its_task_asks_the_runner_for(tmp_path: Path) -> None:
    # Read from the stored archive (no task folder here), so a runner that lacks the
    # key hands the retried run to one that has it, as it does the submitted trials.
    task = tmp_path / "judged"
    shutil.copytree(TASKS / "hello-file", task)
    with (task / "task.toml").open("a") as toml:
        toml.write('\n[verifier.env]\nJUDGE = "${OPENAI_API_KEY}"\n')
    manifest = ExperimentManifest.model_validate(
        {"name": "unit", "tasks": ["judged"], "agents": [{"name": "oracle"}], "repetitions": 2}
    )
    prepared, ports, _, bus = await _submitted(prepared=prepare(manifest, tmp_path))
    assert [t.task_variables for t in prepared.trials] == [["OPENAI_API_KEY"]] * 2
    shutil.rmtree(task)
    for trial in prepared.trials:
        await retry_trial(ports, prepared.experiment_id, trial.trial_id)
    runs = bus.of_type(TrialRequested)
    assert [r.task_variables for r in runs] == [["OPENAI_API_KEY"]] * 2


async def test_a_retry_requires_what_its_task_requires_of_a_runner(tmp_path: Path) -> None:
    # A network allowlist in the local environment needs a root runner: the retried run
    # says so as the submitted trials did, read from the stored archive.
    task = tmp_path / "allowlist-network"
    shutil.copytree(REPO / "tests" / "fixtures" / "tasks" / task.name, task)
    manifest = ExperimentManifest.model_validate(
        {
            "name": "unit",
            "tasks": [task.name],
            "agents": [{"name": "oracle"}],
            "repetitions": 2,
            "compute": {"environment": "local"},
        }
    )
    prepared, ports, _, bus = await _submitted(prepared=prepare(manifest, tmp_path))
    assert [t.task_requires for t in prepared.trials] == [["local.allowlist"]] * 2
    shutil.rmtree(task)
    await retry_trial(ports, prepared.experiment_id, prepared.trials[0].trial_id)
    [run] = bus.of_type(TrialRequested)
    assert run.task_requires == ["local.allowlist"]


async def test_a_harbor_checksum_falls_back_to_the_manifests_task_folder() -> None:
    prepared, ports, _, bus = await _submitted(HARBOR_CHECKSUM)
    trial = prepared.trials[0]
    # Negative control: without the folder, nothing in the ledger names an archive.
    with pytest.raises(UserInputError, match="no archive in the tasks bucket"):
        await retry_trial(ports, prepared.experiment_id, trial.trial_id)
    assert bus.published == []
    # From the wrong folder: the error says where the paths were read from and why.
    with pytest.raises(UserInputError) as info:
        await retry_trial(
            ports, prepared.experiment_id, trial.trial_id, folders=TaskFolders(TASKS.parent)
        )
    assert (
        f"(the manifest's task folders, read from {TASKS.parent}: tasks[0]: task folder "
        f"{TASKS.parent / 'hello-file'} does not exist; did you mean 'tasks/hello-file'?)"
    ) in str(info.value)
    await retry_trial(ports, prepared.experiment_id, trial.trial_id, folders=TaskFolders(TASKS))
    (run,) = bus.of_type(TrialRequested)
    assert run.task == trial.task


async def test_the_archive_a_runner_ran_is_retried_without_the_task_folder() -> None:
    # A completed record carries Harbor's checksum, which names no archive; the archive
    # the runner ran (provenance.task_archive) does, wherever the retry is asked from.
    prepared, ports, ledger, bus = await _submitted(HARBOR_CHECKSUM)
    trial = prepared.trials[0]
    record = await ledger.get_record(trial.trial_id)
    assert record is not None
    provenance = record.provenance.model_copy(update={"task_archive": trial.task.checksum})
    await ledger.upsert_records([record.model_copy(update={"provenance": provenance})])
    await retry_trial(ports, prepared.experiment_id, trial.trial_id)  # no folders
    (run,) = bus.of_type(TrialRequested)
    assert run.task == trial.task


async def test_a_retry_in_a_cancelled_experiment_is_refused_and_a_paused_one_said_to_wait() -> None:
    # The runners end every run of a cancelled experiment unstarted as cancelled: a
    # retry there would be a run that never runs behind a "queued again".
    prepared, ports, _, bus = await _submitted()
    exp, trial = prepared.experiment_id, prepared.trials[0].trial_id
    await ports.coordinator.cancel(exp)
    with pytest.raises(ExperimentCancelled, match="resubmit its manifest"):
        await retry_trial(ports, exp, trial)
    assert bus.published == []
    # The control: a resubmission lifts it, and the retry is published.
    await handlers.submit(prepared, ports)
    bus.published.clear()
    assert (await retry_trial(ports, exp, trial))["paused"] is False
    assert len(bus.of_type(TrialRequested)) == 1
    await ports.coordinator.pause_trial(exp, trial)
    assert (await retry_trial(ports, exp, trial))["paused"] is True


async def test_every_unscored_trial_is_retried_and_no_scored_one() -> None:
    prepared, ports, ledger, bus = await _submitted(rewards=(None, 1.0))
    exp = prepared.experiment_id
    failed = prepared.trials[0]
    answer = await retry_unscored(ports, exp)
    assert answer["n_unscored"] == 1 and answer["paused"] is False
    (run,) = bus.of_type(TrialRequested)
    assert run.trial_id == failed.trial_id and run.run_id.startswith(f"{failed.trial_id}:retry:")
    assert [r["trial_id"] for r in answer["retried"]] == [failed.trial_id]
    assert answer["retried"][0]["previous_status"] == "partial"
    assert run.correlation_id == answer["correlation_id"]  # one id for the request
    # The controls: all scored, nothing to retry; cancelled, refused as one trial is.
    await ledger.upsert_records([_record(failed, failed.task.checksum, finished=T0, reward=0.0)])
    assert (await retry_unscored(ports, exp))["retried"] == []
    await ports.coordinator.cancel(exp)
    with pytest.raises(ExperimentCancelled):
        await retry_unscored(ports, exp)
    assert len(bus.of_type(TrialRequested)) == 1


async def test_a_trial_that_cannot_be_retried_stops_the_batch_before_any_is_published() -> None:
    # Harbor's checksum names no archive; the first trial's record names the one it ran.
    prepared, ports, ledger, bus = await _submitted(HARBOR_CHECKSUM, rewards=(None, None))
    first = prepared.trials[0]
    record = await ledger.get_record(first.trial_id)
    assert record is not None
    provenance = record.provenance.model_copy(update={"task_archive": first.task.checksum})
    await ledger.upsert_records([record.model_copy(update={"provenance": provenance})])
    with pytest.raises(UserInputError, match="no archive in the tasks bucket"):
        await retry_unscored(ports, prepared.experiment_id)
    assert bus.published == []


async def test_only_a_finished_trial_of_a_known_experiment_is_retried() -> None:
    prepared, ports, _, bus = await _submitted()
    with pytest.raises(ExperimentNotFound, match="no experiment"):
        await retry_trial(ports, "nope", prepared.trials[0].trial_id)
    with pytest.raises(ExperimentNotFound, match="no finished trial"):
        await retry_trial(ports, prepared.experiment_id, "exp:unknown-trial")
    assert bus.published == []


async def test_the_retrys_record_replaces_the_old_one_unless_it_failed() -> None:
    """record_order: the run that finished last wins; a failure never erases a result."""
    prepared, _, ledger, _ = await _submitted()
    trial = prepared.trials[0]
    newer = _record(trial, trial.task.checksum, finished=T0 + timedelta(minutes=5), reward=0.0)
    assert (await ledger.upsert_records([newer])).updated == [trial.trial_id]
    stored = await ledger.get_record(trial.trial_id)
    assert stored is not None and stored.evaluation.rewards == {"reward": 0.0}
    # Negative control: a retry that ended partial leaves the complete record.
    failed = _record(trial, trial.task.checksum, finished=T0 + timedelta(minutes=9), reward=None)
    assert (await ledger.upsert_records([failed])).unchanged == [trial.trial_id]
    stored = await ledger.get_record(trial.trial_id)
    assert stored is not None and stored.status == "complete"


async def test_the_experiments_state_shows_a_pause_while_trials_wait() -> None:
    prepared = _prepared()
    ledger = InMemoryLedger()
    info = ExperimentInfo(prepared.experiment_id, "unit", 2, {})
    await ledger.upsert_experiment(info)
    coord = InMemoryCoordinator(lease_ttl_s=60)

    async def nothing_started(_: str) -> list[str]:
        return []

    lookups = queries.Lookups(started_of=nothing_started, paused_of=coord.is_paused)

    async def row_state() -> str:
        row = await queries.experiment_progress(ledger, prepared.experiment_id, lookups)
        return row.progress.state

    assert await row_state() == "running"  # negative control: not paused
    await coord.pause(prepared.experiment_id)
    assert await row_state() == "paused"
    rows = await queries.experiment_rows(ledger, lookups)
    assert [r.progress.state for r in rows] == ["paused"]
    # A cancellation wins over a pause; a finished experiment is not shown paused.
    trial = prepared.trials[0]
    cancelled = _record(trial, trial.task.checksum, finished=T0, reward=None)
    cancelled = cancelled.model_copy(update={"evaluation": single_reward(None, "cancelled")})
    await ledger.upsert_records([cancelled])
    assert await row_state() == "cancelling"
    done = [_record(t, t.task.checksum, finished=T0, reward=1.0) for t in prepared.trials]
    await ledger.upsert_records(done)
    assert await row_state() == "complete"


async def test_a_pause_says_how_many_trials_it_holds() -> None:
    prepared, ports, ledger, _ = await _submitted()  # both trials recorded
    done = await handlers.pause(ledger, ports.coordinator, prepared.experiment_id)
    assert (done["known"], done["unfinished"]) == (True, 0)  # the CLI: nothing waits now
    await ledger.upsert_experiment(ExperimentInfo(prepared.experiment_id, "unit", 3, {}))
    more = await handlers.pause(ledger, ports.coordinator, prepared.experiment_id)
    assert more["unfinished"] == 1
