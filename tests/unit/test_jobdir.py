"""scan_job_dir / import_job_dir on job folders assembled from real Harbor trials."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from schemas.events import ResultImported
from schemas.record import TrialRecord
from services.common.adapters.memory import InMemoryLedger, RecordingBus
from services.common.errors import LedgerUnavailable
from services.common.ports import UpsertOutcome
from services.importer.jobdir import (
    AS_NEW_FLAG,
    ImportConflict,
    JobDirError,
    import_job_dir,
    scan_job_dir,
    scoped_trial_id,
)
from services.importer.records import RecordContext, build_record
from tests.harbor_fixtures import HarborTrials


@pytest.fixture
def job_dir(harbor_trials: HarborTrials, tmp_path: Path) -> Path:
    """A job folder with every real trial plus the awkward cases a real one may hold."""
    job = tmp_path / "My Job 2026-01-02"
    shutil.copytree(harbor_trials.job_dir, job)
    # A trial Harbor never finished: config.json and trial.log, no result.json.
    unfinished = job / "hello-file__unfinished"
    shutil.copytree(harbor_trials["nop"], unfinished)
    (unfinished / "result.json").unlink()
    # A trial whose result.json is garbage.
    garbage = job / "hello-file__garbage"
    shutil.copytree(harbor_trials["oracle"], garbage)
    (garbage / "result.json").write_text('{"id": ')
    # Not trials: a hidden folder of earlier attempts, an empty folder, a file.
    shutil.copytree(harbor_trials["oracle"], job / ".attempts" / "hello-file__oracle.1")
    (job / "empty").mkdir()
    (job / "job.log").write_text("log\n")
    return job


def test_scan_lists_trial_folders_including_unfinished_ones(job_dir: Path) -> None:
    found = scan_job_dir(job_dir)

    assert [f.context.trial_id for f in found] == [
        "broken-verifier__oracle",
        "hello-file__garbage",
        "hello-file__nop",
        "hello-file__oracle",
        "hello-file__unfinished",
        "multi-metric__nop",
        "multi-metric__oracle",
        "never-ending__oracle",
    ]
    by_id = {f.context.trial_id: f for f in found}
    assert {f.context.experiment_id for f in found} == {"harbor-my-job-2026-01-02"}
    ctx = by_id["hello-file__oracle"].context
    assert ctx == RecordContext(
        experiment_id="harbor-my-job-2026-01-02",
        trial_id="hello-file__oracle",
        source="import",
        job_dir=job_dir,
    )


def test_trialbus_marker_gives_the_experiment_id(job_dir: Path) -> None:
    (job_dir / "trialbus.json").write_text(
        json.dumps({"experiment_id": "exp-42", "name": "Exp 42", "job_id": "x"})
    )
    found = scan_job_dir(job_dir)
    assert {f.context.experiment_id for f in found} == {"exp-42"}
    assert {f.context.source for f in found} == {"runner"}


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ("{", "unreadable"),
        ("[]", "needs a non-empty string field 'experiment_id'"),
        ('{"experiment_id": ""}', "needs a non-empty string field 'experiment_id'"),
        ('{"experiment_id": 7}', "needs a non-empty string field 'experiment_id'"),
    ],
)
def test_unusable_marker_stops_the_import_with_a_clear_message(
    job_dir: Path, marker: str, problem: str
) -> None:
    (job_dir / "trialbus.json").write_text(marker)
    with pytest.raises(JobDirError, match=problem) as info:
        scan_job_dir(job_dir)
    assert str(job_dir / "trialbus.json") in str(info.value)


def test_not_a_job_folder(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    with pytest.raises(JobDirError, match="not a directory"):
        scan_job_dir(tmp_path / "absent")
    with pytest.raises(JobDirError, match="trial folder, not a job folder"):
        scan_job_dir(harbor_trials["oracle"])


async def test_a_folder_of_job_folders_is_refused_naming_one_to_import(
    job_dir: Path, tmp_path: Path
) -> None:
    # `trialbus export EXP out/` writes out/<EXP>/; `trialbus import out/` read each job's
    # result.json as a trial's and filed a partial record of nothing under "harbor-out".
    out = tmp_path / "out"
    by_harbor = shutil.copytree(job_dir, out / "harbor-run-job")
    (by_harbor / "config.json").write_text(json.dumps({"job_name": "j", "jobs_dir": "out"}))
    (by_harbor / "result.json").write_text(json.dumps({"finished_at": None}))
    ledger = InMemoryLedger()
    with pytest.raises(JobDirError) as info:
        await import_job_dir(out, ledger)
    assert str(info.value) == (
        f"{out.absolute()}: holds Harbor job folders (harbor-run-job), not trial folders; "
        f"import each job folder on its own (e.g. {by_harbor.absolute()})"
    )
    by_trialbus = shutil.copytree(job_dir, out / "exp-1")
    (by_trialbus / "trialbus.json").write_text(json.dumps({"experiment_id": "exp-1"}))
    with pytest.raises(JobDirError, match=r"\(exp-1, harbor-run-job\), not trial folders"):
        scan_job_dir(out)
    assert await ledger.experiment_ids() == []
    # The job folder itself imports (its trials' config.json are TrialConfigs).
    assert len(scan_job_dir(by_harbor)) == len(scan_job_dir(job_dir))


async def test_import_twice_reports_unchanged_the_second_time(job_dir: Path) -> None:
    ledger = InMemoryLedger()

    first = await import_job_dir(job_dir, ledger, batch_size=3)

    assert (first.total, first.imported, first.inserted, first.unchanged) == (8, 8, 8, 0)
    assert first.partial == 2
    assert first.experiment_id == "harbor-my-job-2026-01-02"
    messages = {(e.trial_id, e.message) for e in first.errors}
    assert (
        "hello-file__garbage",
        "result.json: invalid JSON at line 1 column 8: Expecting value",
    ) in messages
    assert any(
        t == "hello-file__unfinished" and m.startswith("result.json: missing") for t, m in messages
    )
    assert await ledger.scored_trial_ids("harbor-my-job-2026-01-02") == {
        "hello-file__nop",
        "hello-file__oracle",
        "multi-metric__nop",
        "multi-metric__oracle",
        "never-ending__oracle",
    }

    second = await import_job_dir(job_dir, ledger, batch_size=3)

    assert (second.total, second.imported, second.unchanged, second.partial) == (8, 0, 8, 2)


async def test_a_fixed_trial_is_updated_and_a_lost_result_never_erases_one(
    job_dir: Path, harbor_trials: HarborTrials
) -> None:
    ledger = InMemoryLedger()
    await import_job_dir(job_dir, ledger)
    # The garbage result.json gets repaired; the oracle's result.json disappears.
    shutil.copy(harbor_trials["oracle"] / "result.json", job_dir / "hello-file__garbage")
    (job_dir / "hello-file__oracle" / "result.json").unlink()

    summary = await import_job_dir(job_dir, ledger)

    assert (summary.updated, summary.unchanged) == (1, 7)
    oracle = await ledger.get_record("hello-file__oracle")
    assert oracle is not None and oracle.status == "complete"
    repaired = await ledger.get_record("hello-file__garbage")
    assert repaired is not None and repaired.status == "complete"


async def test_records_written_by_runners_are_not_rewritten_by_an_import(
    job_dir: Path,
) -> None:
    (job_dir / "trialbus.json").write_text(json.dumps({"experiment_id": "exp-42"}))
    ledger = InMemoryLedger()
    trial = job_dir / "hello-file__oracle"
    # What the importer service stored from the runner's TrialCompleted event.
    from_runner = build_record(
        trial,
        RecordContext(
            experiment_id="exp-42",
            trial_id=trial.name,
            repetition=2,
            agent_label="Oracle",
            runner_host="runner-3",
            harbor_version="0.25.0",
            source="runner",
            job_dir=job_dir,
            attempts=2,
            task_archive="cd" * 32,
        ),
    )
    assert from_runner.provenance.task_archive == "cd" * 32
    await ledger.upsert_records([from_runner])

    summary = await import_job_dir(job_dir, ledger)

    assert (summary.inserted, summary.updated, summary.unchanged) == (7, 0, 1)
    assert await ledger.get_record(trial.name) == from_runner


async def test_empty_job_folder(tmp_path: Path) -> None:
    summary = await import_job_dir(tmp_path, InMemoryLedger())
    assert (summary.total, summary.imported, summary.errors) == (0, 0, [])


async def test_batch_size_must_be_positive(job_dir: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        await import_job_dir(job_dir, InMemoryLedger(), batch_size=0)


# -- announcing a CLI import (ResultImported, as the importer service does) ----------------


async def test_an_import_with_a_bus_announces_every_record_it_writes(job_dir: Path) -> None:
    ledger, bus = InMemoryLedger(), RecordingBus()

    await import_job_dir(job_dir, ledger, batch_size=3, bus=bus)

    announced = {e.trial_id: e for e in bus.published if isinstance(e, ResultImported)}
    assert len(bus.published) == len(announced) == 8  # one each, nothing else
    for record in await ledger.records_for("harbor-my-job-2026-01-02"):
        event = announced[record.trial_id]
        assert event.experiment_id == record.experiment_id
        assert event.status == record.status
        assert event.scored is record.evaluation.reward_valid
        assert event.main_reward == record.evaluation.main_reward
        assert event.changed
    assert announced["hello-file__oracle"].scored and announced["hello-file__oracle"].main_reward
    assert not announced["hello-file__garbage"].scored

    # Importing again announces every record again, as unchanged.
    again = RecordingBus()
    await import_job_dir(job_dir, ledger, bus=again)
    assert len(again.published) == 8
    assert not any(e.changed for e in again.published if isinstance(e, ResultImported))


class DownLedger(InMemoryLedger):
    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        raise LedgerUnavailable("connection refused")


async def test_nothing_is_announced_before_it_is_in_the_ledger(job_dir: Path) -> None:
    bus = RecordingBus()
    with pytest.raises(LedgerUnavailable):
        await import_job_dir(job_dir, DownLedger(), bus=bus)
    assert bus.published == []


# -- a copied or renamed folder is never a silent move ------------------------------------


async def test_a_copied_folder_is_a_conflict_and_the_original_keeps_its_records(
    job_dir: Path,
) -> None:
    ledger = InMemoryLedger()
    first = await import_job_dir(job_dir, ledger, batch_size=3)
    original = await ledger.records_for(first.experiment_id)
    copy = job_dir.with_name("copy")
    shutil.copytree(job_dir, copy)
    bus = RecordingBus()

    with pytest.raises(ImportConflict) as info:
        await import_job_dir(copy, ledger, batch_size=3, bus=bus)

    message = str(info.value)
    assert first.experiment_id in message and "harbor-copy" in message
    assert AS_NEW_FLAG in message and "8 of 8 trials" in message
    assert info.value.summary.conflicts == dict.fromkeys(
        [r.trial_id for r in original], first.experiment_id
    )
    assert info.value.summary.imported == 0
    assert await ledger.records_for(first.experiment_id) == original
    assert await ledger.records_for("harbor-copy") == []
    assert bus.of_type(ResultImported) == []  # nothing claims the trials for the copy


async def test_as_new_imports_a_copy_under_its_own_experiment_and_ids(job_dir: Path) -> None:
    ledger = InMemoryLedger()
    first = await import_job_dir(job_dir, ledger)
    original = await ledger.records_for(first.experiment_id)
    copy = job_dir.with_name("copy")
    shutil.copytree(job_dir, copy)

    summary = await import_job_dir(copy, ledger, as_new=True)

    assert (summary.experiment_id, summary.inserted, summary.conflicts) == ("harbor-copy", 8, {})
    copied = await ledger.records_for("harbor-copy")
    assert {r.trial_id for r in copied} == {
        scoped_trial_id("harbor-copy", r.trial_id) for r in original
    }
    assert await ledger.records_for(first.experiment_id) == original
    # Deterministic: importing the copy as new again changes nothing.
    again = await import_job_dir(copy, ledger, as_new=True)
    assert (again.imported, again.unchanged) == (0, 8)


async def test_as_new_is_refused_for_a_trialbus_job_folder(job_dir: Path) -> None:
    (job_dir / "trialbus.json").write_text(json.dumps({"experiment_id": "exp-42"}))
    ledger = InMemoryLedger()
    with pytest.raises(JobDirError, match="--as-new imports folders made outside trialbus"):
        await import_job_dir(job_dir, ledger, as_new=True)
    assert await ledger.records_for("exp-42") == []


async def test_as_new_is_refused_for_a_folder_already_imported_as_itself(job_dir: Path) -> None:
    ledger = InMemoryLedger()
    first = await import_job_dir(job_dir, ledger)
    before = await ledger.records_for(first.experiment_id)
    with pytest.raises(JobDirError, match="import it without --as-new"):
        await import_job_dir(job_dir, ledger, as_new=True)
    assert await ledger.records_for(first.experiment_id) == before


def test_scoped_trial_ids_differ_per_experiment() -> None:
    assert scoped_trial_id("harbor-a", "t__x") != scoped_trial_id("harbor-b", "t__x")
    assert scoped_trial_id("harbor-a", "t__x").startswith("t__x__")
