"""The watcher's handlers: completion checks, the re-check safety net, external job
scans, and one verdict per message; against the in-memory ledger and a recording bus.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from schemas.events import (
    ExperimentCompleted,
    ExperimentSubmitted,
    TrialCompleted,
    encode_event,
)
from schemas.objects import ObjectRef
from services.common.adapters.memory import InMemoryLedger, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.errors import (
    ACK,
    BUG_RETRY_DELAY_S,
    TERM,
    LedgerUnavailable,
    nak,
)
from services.common.ports import ExperimentInfo
from services.common.trial_folders import TrialFolders
from services.common.unpack import unpack_trial
from services.watcher import handlers
from services.watcher.handlers import Watcher, handle_batch
from tests.support.event_builders import result_imported
from tests.support.log_recorder import LogRecorder
from tests.unit.test_watcher_logic import record

DELAY = 2.0


async def setup(
    tmp_path: Path, n_trials: int, trial_ids: Sequence[str] = ()
) -> tuple[InMemoryLedger, RecordingBus, Watcher]:
    ledger, bus = InMemoryLedger(), RecordingBus()
    await ledger.upsert_experiment(ExperimentInfo("exp", "Exp", n_trials, {}))
    await ledger.upsert_records([record(t) for t in trial_ids])
    return ledger, bus, Watcher(ledger, bus, tmp_path / "jobs", folders())


def folders() -> TrialFolders:
    """Trial folders stored in memory (the results bucket), no retry pauses."""
    return TrialFolders(InMemoryObjectStore("RESULTS"), cap_bytes=1 << 20, retry_delays_s=())


# -- completion ----------------------------------------------------------------------------


async def test_completion_is_published_when_the_last_trial_is_recorded(tmp_path: Path) -> None:
    ledger, bus, watcher = await setup(tmp_path, 2, ["a"])

    await watcher.check("exp", "corr", ["a"])
    assert bus.of_type(ExperimentCompleted) == []  # negative control: one record missing

    await ledger.upsert_records([record("b", scored=False)])
    await watcher.check("exp", "corr", ["b"])
    [done] = bus.of_type(ExperimentCompleted)
    assert (done.experiment_id, done.correlation_id) == ("exp", "corr")
    assert (done.n_trials, done.n_scored, done.n_partial) == (2, 1, 1)


async def test_a_replayed_import_after_completion_announces_the_same_completion(
    tmp_path: Path,
) -> None:
    _, bus, watcher = await setup(tmp_path, 1, ["a"])
    await watcher.check("exp", "corr", ["a"])
    await watcher.check("exp", "corr", ["a"])
    # Same counts, same dedup id: JetStream keeps one (the fake bus does the same).
    assert len(bus.of_type(ExperimentCompleted)) == 1


async def test_an_undercounting_tally_is_caught_by_the_recheck(tmp_path: Path) -> None:
    # Two watchers share the durable: this one sees the submission and a's import,
    # the other one b's. Both records are in the ledger.
    ledger, bus, watcher = await setup(tmp_path, 2)
    await watcher.check("exp", "corr")  # ExperimentSubmitted: counted 0
    await ledger.upsert_records([record("a"), record("b")])
    await watcher.check("exp", "corr", ["a"])  # 0 + 1 < 2: the ledger is not asked
    assert bus.of_type(ExperimentCompleted) == []

    await watcher.recheck()
    assert len(bus.of_type(ExperimentCompleted)) == 1


async def test_recheck_asks_only_about_experiments_with_imports_since_the_count(
    tmp_path: Path,
) -> None:
    ledger, bus, watcher = await setup(tmp_path, 1)
    await watcher.check("exp", "corr")  # counted 0, no import since
    await ledger.upsert_records([record("a")])  # written, but its ResultImported not seen
    await watcher.recheck()
    assert bus.of_type(ExperimentCompleted) == []
    await watcher.check("exp", "corr", ["a"])
    assert len(bus.of_type(ExperimentCompleted)) == 1


async def test_completion_leaves_job_folders_to_the_importer(tmp_path: Path) -> None:
    # The watcher may run on another machine than the importer's job folders.
    _, bus, watcher = await setup(tmp_path, 1, ["a"])
    job_dir = tmp_path / "jobs" / "exp"
    job_dir.mkdir(parents=True)
    (job_dir / "trialbus.json").write_text(json.dumps({"experiment_id": "exp"}))
    await watcher.check("exp", "corr", ["a"])
    assert len(bus.of_type(ExperimentCompleted)) == 1
    assert not (job_dir / "result.json").exists()


# -- external Harbor jobs ------------------------------------------------------------------


def harbor_job(jobs_dir: Path, name: str, trials: Sequence[str], *, finished: bool = True) -> Path:
    """A job folder as `harbor run` leaves it (trial folders hold only a trial.log here)."""
    job = jobs_dir / name
    job.mkdir(parents=True)
    (job / "result.json").write_text(
        json.dumps({"finished_at": "2026-01-01T00:00:00Z" if finished else None})
    )
    for trial in trials:
        (job / trial).mkdir()
        (job / trial / "trial.log").write_text("log\n")
    return job


async def test_scan_announces_each_unrecorded_trial_of_a_finished_external_job_once(
    tmp_path: Path,
) -> None:
    jobs = tmp_path / "jobs"
    job = harbor_job(jobs, "My Job", ["t-1", "t-2", "t-3"])
    harbor_job(jobs, "running", ["r-1"], finished=False)
    marked = harbor_job(jobs, "exp-by-trialbus", ["x-1"])
    (marked / "trialbus.json").write_text(json.dumps({"experiment_id": "exp-by-trialbus"}))
    harbor_job(jobs, "empty", [])
    ledger, bus = InMemoryLedger(), RecordingBus()
    await ledger.upsert_records([record("t-2", experiment_id="harbor-my-job")])
    stored = folders()
    watcher = Watcher(ledger, bus, jobs, stored)

    assert await watcher.scan_external() == 2
    [submitted] = bus.of_type(ExperimentSubmitted)
    assert (submitted.experiment_id, submitted.n_trials) == ("harbor-my-job", 3)
    assert submitted.manifest["job_name"] == "My Job"
    completed = bus.of_type(TrialCompleted)
    assert [c.trial_id for c in completed] == ["t-1", "t-3"]  # t-2 is recorded already
    assert {c.source for c in completed} == {"external"}
    # No path travels: the folder is in the results bucket, named by the event.
    assert completed[0].trial_name == "t-1"
    data = await stored.store.get(completed[0].result)
    unpacked = unpack_trial(data, tmp_path / "unpacked")
    assert (unpacked / "trial.log").read_text() == (job / "t-1" / "trial.log").read_text()

    # A second scan announces nothing: the job was announced.
    n_published = len(bus.published)
    assert await watcher.scan_external() == 0
    assert len(bus.published) == n_published
    # A restarted watcher announces the job again, but with the same dedup ids.
    assert await Watcher(ledger, bus, jobs, stored).scan_external() == 2
    assert len(bus.published) == n_published
    assert "harbor-my-job:external-submitted" in bus.duplicates


async def test_scan_picks_up_a_job_once_it_finishes(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    job = harbor_job(jobs, "later", ["t-1"], finished=False)
    watcher = Watcher(InMemoryLedger(), bus := RecordingBus(), jobs, folders())
    assert await watcher.scan_external() == 0
    (job / "result.json").write_text(json.dumps({"finished_at": "2026-01-01T00:00:00Z"}))
    assert await watcher.scan_external() == 1
    assert [c.trial_id for c in bus.of_type(TrialCompleted)] == ["t-1"]


async def test_a_folder_that_cannot_be_imported_is_named_once_and_the_jobs_after_it_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trial folder dropped straight into the jobs folder has a finished result.json,
    # like a job; a job folder copied into another one holds a job, not trials. Neither
    # can be imported; the jobs named after them in the folder must still be announced.
    jobs = tmp_path / "jobs"
    stray = harbor_job(jobs, "a-stray-trial", [])
    (stray / "agent").mkdir()
    nested = harbor_job(jobs, "b-jobs", [])
    inner = harbor_job(nested, "inner", ["i-1"])
    (inner / "config.json").write_text(json.dumps({"job_name": "inner", "jobs_dir": "x"}))
    harbor_job(jobs, "c-job", ["t-1"])
    watcher = Watcher(InMemoryLedger(), bus := RecordingBus(), jobs, folders())
    monkeypatch.setattr(handlers, "log", recorder := LogRecorder())

    assert await watcher.scan_external() == 1
    assert [e.experiment_id for e in bus.of_type(ExperimentSubmitted)] == ["harbor-c-job"]
    skipped = [e for e in recorder.entries if e["event"].startswith(NOT_IMPORTED)]
    assert [e["job"] for e in skipped] == [str(stray), str(nested)]
    assert "this is a trial folder" in skipped[0]["problem"]
    assert "holds Harbor job folders (inner)" in skipped[1]["problem"]
    # Said once: the next scans look again (the folder may be fixed) but log nothing.
    assert await watcher.scan_external() == 0
    assert len([e for e in recorder.entries if e["event"].startswith(NOT_IMPORTED)]) == 2


NOT_IMPORTED = "external harbor job not announced: its folder cannot be imported"
LEFT_OUT = "external harbor job: trials that are another experiment's are left out"


async def test_a_copied_job_leaves_out_the_trials_another_experiment_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The folders' names are the trial ids: a copy of a job names the original's trials.
    # The importer refuses to move a record between experiments, so announcing them
    # would leave the copy's experiment waiting forever for records it cannot get.
    jobs = tmp_path / "jobs"
    harbor_job(jobs, "My Job copy", ["t-1", "t-2", "t-9"])
    ledger, bus = InMemoryLedger(), RecordingBus()
    await ledger.upsert_records([record(t, experiment_id="harbor-my-job") for t in ["t-1", "t-2"]])
    watcher = Watcher(ledger, bus, jobs, folders())

    monkeypatch.setattr(handlers, "log", recorder := LogRecorder())
    assert await watcher.scan_external() == 1
    logs = recorder.entries
    [submitted] = bus.of_type(ExperimentSubmitted)
    assert (submitted.experiment_id, submitted.n_trials) == ("harbor-my-job-copy", 1)
    assert [c.trial_id for c in bus.of_type(TrialCompleted)] == ["t-9"]
    [warned] = [e for e in logs if e["event"].startswith(LEFT_OUT)]
    assert (warned["left_out"], warned["other_experiments"]) == (2, ["harbor-my-job"])
    # Control: the same trials recorded under the job's own experiment count in it
    # (announced already, so not again), and nothing is left out.
    own = tmp_path / "own"
    harbor_job(own, "My Job", ["t-1", "t-2", "t-9"])
    bus = RecordingBus()
    monkeypatch.setattr(handlers, "log", recorder := LogRecorder())
    assert await Watcher(ledger, bus, own, folders()).scan_external() == 1
    logs = recorder.entries
    [submitted] = bus.of_type(ExperimentSubmitted)
    assert (submitted.experiment_id, submitted.n_trials) == ("harbor-my-job", 3)
    assert not [e for e in logs if e["event"].startswith(LEFT_OUT)]


async def test_two_jobs_naming_the_same_trials_in_one_scan_announce_them_once(
    tmp_path: Path,
) -> None:
    # Nothing is in the ledger yet: the first job (in name order) claims the trials.
    jobs = tmp_path / "jobs"
    harbor_job(jobs, "a", ["t-1", "t-2"])
    harbor_job(jobs, "b", ["t-1", "t-2"])
    watcher = Watcher(InMemoryLedger(), bus := RecordingBus(), jobs, folders())

    assert await watcher.scan_external() == 2
    assert [(e.experiment_id, e.n_trials) for e in bus.of_type(ExperimentSubmitted)] == [
        ("harbor-a", 2)
    ]
    assert {c.experiment_id for c in bus.of_type(TrialCompleted)} == {"harbor-a"}
    # The job left empty is done with: a later scan does not look at it again.
    assert await watcher.scan_external() == 0
    assert len(bus.of_type(ExperimentSubmitted)) == 1


async def test_an_announced_trial_is_forgotten_once_recorded_and_its_copy_still_left_out(
    tmp_path: Path,
) -> None:
    # The watcher remembers whose an announced trial is only until its record exists:
    # from then on the ledger says so, and the memory does not grow with every trial.
    jobs = tmp_path / "jobs"
    harbor_job(jobs, "a", ["t-1", "t-2"])
    ledger = InMemoryLedger()
    watcher = Watcher(ledger, bus := RecordingBus(), jobs, folders())
    assert await watcher.scan_external() == 2
    assert watcher.unrecorded_claims == 2
    await ledger.upsert_records([record(t, experiment_id="harbor-a") for t in ["t-1", "t-2"]])
    await watcher.check("harbor-a", "corr", imported=["t-1"])
    assert watcher.unrecorded_claims == 1  # t-2's ResultImported is not seen yet
    # A copy scanned now: both are recorded, so the ledger leaves them out.
    harbor_job(jobs, "b", ["t-1", "t-2"])
    assert await watcher.scan_external() == 0
    assert watcher.unrecorded_claims == 0  # t-2's record was read: the claim is let go
    assert [e.experiment_id for e in bus.of_type(ExperimentSubmitted)] == ["harbor-a"]


# -- one verdict per message ---------------------------------------------------------------


def submitted(n_trials: int, correlation_id: str = "corr") -> bytes:
    return encode_event(
        ExperimentSubmitted(
            experiment_id="exp",
            name="Exp",
            n_trials=n_trials,
            n_published=n_trials,
            manifest={},
            correlation_id=correlation_id,
        )
    )


def imported(trial_id: str, correlation_id: str = "corr") -> bytes:
    return encode_event(
        result_imported(trial_id, experiment_id="exp", correlation_id=correlation_id)
    )


async def test_a_batch_is_acked_poison_terminated_and_completion_published(
    tmp_path: Path,
) -> None:
    _, bus, watcher = await setup(tmp_path, 2, ["a", "b"])
    batch = [submitted(2, "c0"), imported("a", "c1"), b"\xff not json", imported("b", "c2")]

    settles = await handle_batch(watcher, batch, transient_delay_s=DELAY)

    assert settles == [ACK, ACK, TERM, ACK]
    [done] = bus.of_type(ExperimentCompleted)
    assert done.correlation_id == "c2"  # the latest event's


class FailingLedger(InMemoryLedger):
    """A ledger whose reads fail with ``error`` (None: a working ledger)."""

    def __init__(self, error: Exception | None) -> None:
        super().__init__()
        self.error = error

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        if self.error is not None:
            raise self.error
        return await super().get_experiment(experiment_id)


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (LedgerUnavailable("connection refused"), nak(DELAY, "transient")),
        (RuntimeError("a bug"), nak(max(DELAY, BUG_RETRY_DELAY_S), "bug")),
        (None, ACK),  # negative control: the same batch, a working ledger
    ],
)
async def test_a_failed_check_naks_the_batch_but_terminates_its_poison(
    tmp_path: Path, error: Exception | None, verdict: object
) -> None:
    watcher = Watcher(FailingLedger(error), RecordingBus(), tmp_path / "jobs", folders())
    batch = [imported("a"), b"{}", imported("b")]
    assert await handle_batch(watcher, batch, transient_delay_s=DELAY) == [verdict, TERM, verdict]


async def test_events_that_need_no_check_are_acked_without_asking_the_ledger(
    tmp_path: Path,
) -> None:
    watcher = Watcher(
        FailingLedger(RuntimeError("must not be asked")), RecordingBus(), tmp_path, folders()
    )
    stored = ObjectRef(bucket="RESULTS", name="exp/a/1.tar.gz", size=1, sha256="ab" * 32)
    event = TrialCompleted(experiment_id="exp", trial_id="a", result=stored, trial_name="a")
    assert await handle_batch(watcher, [encode_event(event)], transient_delay_s=DELAY) == [ACK]
