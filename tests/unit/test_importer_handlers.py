"""The importer's batch handling: one verdict per message.

A record the ledger refuses never holds its batch; poison is terminated; a ledger
outage naks the batch; a bug naks only its own message until BUG_MAX_DELIVERIES, then
becomes an acknowledged ImporterError record (docstring of services.importer.handlers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.events import (
    ExperimentCompleted,
    ResultImported,
    TrialCompleted,
    encode_event,
)
from schemas.record import Evaluation, PhaseTiming, Provenance, TrialRecord
from services.common.adapters.memory import InMemoryLedger, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.archive import pack_trial
from services.common.errors import (
    ACK,
    BUG_RETRY_DELAY_S,
    TERM,
    InternalError,
    LedgerUnavailable,
    PoisonMessage,
    Settle,
    TransientError,
    nak,
)
from services.common.ports import UpsertOutcome
from services.importer import event_records, handlers
from services.importer.event_records import BUG_MAX_DELIVERIES, record_failure_verdict
from services.importer.folders import StoredTrials
from services.importer.handlers import (
    BatchPlan,
    Incoming,
    apply_plan,
    failed_batch_settles,
    handle_batch,
)
from services.importer.records import RecordContext, build_failed_record, build_record
from tests.support.event_builders import trial_failed
from tests.support.log_recorder import LogRecorder


class RefusingLedger(InMemoryLedger):
    """Refuses any write that contains the trial ``bad`` (like an oversized document)."""

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        if any(
            r.trial_id == "bad" and r.evaluation.exception_type != "LedgerRefusedRecord"
            for r in records
        ):
            raise ValueError("document too large")
        return await super().upsert_records(records)


def record(trial_id: str) -> TrialRecord:
    """A final agent failure's record: a real record without any trial folder."""
    return build_failed_record(trial_failed(trial_id))


async def test_refused_record_is_replaced_and_the_rest_of_the_batch_lands() -> None:
    ledger, bus = RefusingLedger(), RecordingBus()
    plan = BatchPlan(records={"good": record("good"), "bad": record("bad")})
    await apply_plan(plan, ledger, bus)
    good, bad = await ledger.get_record("good"), await ledger.get_record("bad")
    assert good is not None and good == record("good")
    assert bad is not None and bad.status == "partial"
    assert bad.evaluation.exception_type == "LedgerRefusedRecord"
    assert any("document too large" in e for e in bad.errors)
    imported = bus.of_type(ResultImported)
    assert sorted(e.trial_id for e in imported) == ["bad", "good"]


# -- one verdict per message: poison, transient, bug --------------------------------------

BUG = "buggy"


@pytest.fixture
def buggy_importer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make building the record of trial ``buggy`` raise, as an importer bug would."""
    real = build_record

    def build(trial_dir: Path, context: RecordContext) -> TrialRecord:
        if context.trial_id == BUG:
            raise KeyError("a bug")
        return real(trial_dir, context)

    monkeypatch.setattr(event_records, "build_record", build)


def stored_trials(jobs_root: Path = Path("/nonexistent/jobs")) -> StoredTrials:
    """An importer's view of a results bucket held in memory."""
    return StoredTrials(InMemoryObjectStore("RESULTS"), jobs_root)


async def completed(trial_id: str, trials: StoredTrials, tmp_path: Path) -> bytes:
    # A stored folder with no result.json: a real (partial) record, no Harbor fixture.
    folder = tmp_path / "runner" / trial_id
    folder.mkdir(parents=True)
    (folder / "trial.log").write_text("no result")
    ref = await trials.store.put(f"e/{trial_id}/1.tar.gz", pack_trial(folder).data)
    return encode_event(
        TrialCompleted(
            experiment_id="e",
            trial_id=trial_id,
            result=ref,
            trial_name=trial_id,
            correlation_id=f"corr-{trial_id}",
        )
    )


def failed(trial_id: str) -> bytes:
    return encode_event(trial_failed(trial_id))


DELAY = 2.0
BUG_NAK = nak(max(DELAY, BUG_RETRY_DELAY_S), "bug")


@pytest.mark.parametrize(
    ("exc", "delivered", "expected"),
    [
        (KeyError("x"), 1, nak(BUG_RETRY_DELAY_S, "bug")),
        (InternalError("x"), BUG_MAX_DELIVERIES - 1, nak(BUG_RETRY_DELAY_S, "bug")),
        # Given up: an acknowledged ImporterError record instead of another nak.
        (KeyError("x"), BUG_MAX_DELIVERIES, ACK),
        (InternalError("x"), BUG_MAX_DELIVERIES + 3, ACK),
        # Transient: nothing is decided yet, so never given up on.
        (TransientError("x"), 1, nak(DELAY, "transient")),
        (LedgerUnavailable("x"), 100, nak(DELAY, "transient")),
        # Never terminated: the trial would be left without any record.
        (PoisonMessage("x"), 1, ACK),
    ],
)
def test_record_failure_verdict(exc: Exception, delivered: int, expected: Settle) -> None:
    assert record_failure_verdict(exc, delivered, transient_delay_s=DELAY) == expected


@pytest.mark.usefixtures("buggy_importer")
async def test_a_bug_naks_only_its_message_and_the_rest_of_the_batch_lands(
    tmp_path: Path,
) -> None:
    ledger, bus, trials = InMemoryLedger(), RecordingBus(), stored_trials(tmp_path / "jobs")
    bugged = await completed(BUG, trials, tmp_path)
    batch = [Incoming(failed("good")), Incoming(bugged), Incoming(b"{")]

    settles = await handle_batch(batch, ledger, bus, trials, transient_delay_s=DELAY)

    assert settles == [ACK, BUG_NAK, TERM]
    assert await ledger.get_record(BUG) is None
    good = await ledger.get_record("good")
    assert good is not None and good.status == "partial"
    assert [e.trial_id for e in bus.of_type(ResultImported)] == ["good"]


@pytest.mark.usefixtures("buggy_importer")
async def test_after_max_deliveries_a_bug_becomes_an_importer_error_record(
    tmp_path: Path,
) -> None:
    ledger, bus, trials = InMemoryLedger(), RecordingBus(), stored_trials(tmp_path / "jobs")
    batch = [
        Incoming(await completed(BUG, trials, tmp_path), delivered=BUG_MAX_DELIVERIES),
        Incoming(await completed("fine", trials, tmp_path), delivered=BUG_MAX_DELIVERIES),
    ]

    settles = await handle_batch(batch, ledger, bus, trials, transient_delay_s=DELAY)

    assert settles == [ACK, ACK]
    record = await ledger.get_record(BUG)
    assert record is not None and record.status == "partial"
    assert not record.evaluation.reward_valid
    assert record.evaluation.failure_class == "infrastructure"
    assert record.evaluation.exception_type == "ImporterError"
    assert "KeyError: 'a bug'" in (record.evaluation.exception_message or "")
    # A record of a trial that built fine is not marked as the importer's failure.
    fine = await ledger.get_record("fine")
    assert fine is not None and fine.evaluation.exception_type is None
    announced = {e.trial_id: e for e in bus.of_type(ResultImported)}
    assert set(announced) == {BUG, "fine"}
    assert announced[BUG].correlation_id == f"corr-{BUG}"
    assert announced[BUG].scored is False


class DownLedger(InMemoryLedger):
    """A ledger that cannot be reached."""

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        raise LedgerUnavailable("connection refused")


async def test_ledger_down_naks_the_batch_but_still_terminates_poison() -> None:
    batch = [Incoming(failed("a")), Incoming(b"not json"), Incoming(failed("b"))]
    transient = nak(DELAY, "transient")

    down = await handle_batch(
        batch, DownLedger(), RecordingBus(), stored_trials(), transient_delay_s=DELAY
    )
    # Negative control: the same batch against a reachable ledger is acknowledged.
    up = await handle_batch(
        batch, InMemoryLedger(), RecordingBus(), stored_trials(), transient_delay_s=DELAY
    )

    assert down == [transient, TERM, transient]
    assert up == [ACK, TERM, ACK]


async def test_a_failed_announcement_naks_the_batch_as_settle_error_says() -> None:
    bus, unconfirmed = RecordingBus(), RecordingBus()
    bus.fail_next.append(AttributeError("a bug in the bus"))
    unconfirmed.fail_next.append(TransientError("publish not confirmed"))
    batch = [Incoming(failed("a"))]
    assert await handle_batch(
        batch, InMemoryLedger(), bus, stored_trials(), transient_delay_s=DELAY
    ) == [BUG_NAK]
    assert await handle_batch(
        batch, InMemoryLedger(), unconfirmed, stored_trials(), transient_delay_s=DELAY
    ) == [nak(DELAY, "transient")]


def test_failed_batch_settles_keeps_poison_terminated() -> None:
    verdict = nak(DELAY, "transient")
    plan = BatchPlan(settles=[ACK, TERM, BUG_NAK])
    assert failed_batch_settles(plan, 3, verdict) == [verdict, TERM, verdict]
    # Without a plan (decoding itself failed), every message gets the verdict.
    assert failed_batch_settles(None, 2, verdict) == [verdict, verdict]


def test_within_a_batch_the_ledgers_order_decides() -> None:
    # Attempt 1's completion redelivered into the batch that holds attempt 2's.
    def complete(attempts: int, second: int) -> TrialRecord:
        return TrialRecord(
            trial_id="t",
            experiment_id="e",
            status="complete",
            provenance=Provenance(task_name="hello", agent_name="oracle"),
            timing=PhaseTiming(finished_at=datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)),
            evaluation=Evaluation(reward_valid=True, main_reward=float(attempts)),
            attempts=attempts,
        )

    older, newer = complete(1, 1), complete(2, 2)
    assert handlers._prefer(older, newer) == newer
    assert handlers._prefer(newer, older) == newer
    # Negative control: a partial never displaces a complete, a complete does a partial.
    assert handlers._prefer(record("t"), older) == older
    assert handlers._prefer(older, record("t")) == older


# -- a record never changes experiment ---------------------------------------------------


def forged_failure(trial_id: str, experiment_id: str) -> bytes:
    """A final failure naming ``experiment_id`` (forged when the trial is another's)."""
    return encode_event(trial_failed(trial_id, experiment_id=experiment_id))


async def test_an_event_for_another_experiments_trial_is_acked_logged_and_not_announced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger, bus = InMemoryLedger(), RecordingBus()
    await handle_batch(
        [Incoming(failed("t1"))], ledger, bus, stored_trials(), transient_delay_s=DELAY
    )
    stored = await ledger.get_record("t1")
    assert stored is not None and stored.experiment_id == "e"
    bus.published.clear()
    batch = [Incoming(forged_failure("t1", "forger")), Incoming(forged_failure("t2", "forger"))]

    monkeypatch.setattr(handlers, "log", recorder := LogRecorder())
    settles = await handle_batch(batch, ledger, bus, stored_trials(), transient_delay_s=DELAY)
    logs = recorder.entries

    # Acknowledged: a redelivery could not change the answer (no poison loop).
    assert settles == [ACK, ACK]
    assert await ledger.get_record("t1") == stored
    assert [r.trial_id for r in await ledger.records_for("forger")] == ["t2"]
    assert [(e.experiment_id, e.trial_id) for e in bus.of_type(ResultImported)] == [
        ("forger", "t2")
    ]
    refused = [entry for entry in logs if entry.get("trial_id") == "t1"]
    assert len(refused) == 1
    assert (refused[0]["experiment_id"], refused[0]["stored_experiment_id"]) == ("forger", "e")
    assert refused[0]["log_level"] == "error"


async def test_the_same_event_for_the_stored_experiment_is_announced() -> None:
    # Negative control of the test above: only the experiment differs.
    ledger, bus = InMemoryLedger(), RecordingBus()
    await handle_batch(
        [Incoming(failed("t1"))], ledger, bus, stored_trials(), transient_delay_s=DELAY
    )
    bus.published.clear()

    settles = await handle_batch(
        [Incoming(failed("t1"))], ledger, bus, stored_trials(), transient_delay_s=DELAY
    )

    assert settles == [ACK]
    assert [(e.trial_id, e.changed) for e in bus.of_type(ResultImported)] == [("t1", False)]


# -- trial folders come from the results bucket ---------------------------------------


async def test_a_stored_trial_folder_becomes_the_importers_job_folder(tmp_path: Path) -> None:
    ledger, bus, trials = InMemoryLedger(), RecordingBus(), stored_trials(tmp_path / "jobs")
    event = await completed("t1", trials, tmp_path)

    assert await handle_batch([Incoming(event)], ledger, bus, trials, transient_delay_s=DELAY) == [
        ACK
    ]

    placed = tmp_path / "jobs" / "e" / "t1"
    assert (placed / "trial.log").read_text() == "no result"
    assert (tmp_path / "jobs" / "e" / "trialbus.json").is_file()  # a trialbus job folder
    record = await ledger.get_record("t1")
    assert record is not None
    assert record.artifacts.trial_dir == str(placed)
    assert record.artifacts.archive == TrialCompleted.model_validate_json(event).result
    # Redelivered: the folder is replaced by the same contents, not duplicated.
    await handle_batch([Incoming(event)], ledger, bus, trials, transient_delay_s=DELAY)
    assert sorted(p.name for p in (tmp_path / "jobs" / "e").iterdir()) == [
        "config.json",
        "t1",
        "trialbus.json",
    ]


async def test_a_damaged_stored_folder_gives_a_partial_record_at_once(tmp_path: Path) -> None:
    ledger, bus, trials = InMemoryLedger(), RecordingBus(), stored_trials(tmp_path / "jobs")
    good = TrialCompleted.model_validate_json(await completed("t1", trials, tmp_path))
    damaged = good.model_copy(
        update={"result": good.result.model_copy(update={"sha256": "0" * 64})}
    )

    settles = await handle_batch(
        [Incoming(encode_event(damaged))], ledger, bus, trials, transient_delay_s=DELAY
    )

    assert settles == [ACK]  # a redelivery would fetch the same bytes
    record = await ledger.get_record("t1")
    assert record is not None and record.status == "partial"
    assert record.evaluation.exception_type == "ObjectCorrupt"
    assert not record.evaluation.reward_valid
    # Negative control: the undamaged reference builds the folder's own record.
    await handle_batch([Incoming(encode_event(good))], ledger, bus, trials, transient_delay_s=DELAY)
    record = await ledger.get_record("t1")
    assert record is not None and record.evaluation.exception_type is None


async def test_a_missing_stored_folder_is_waited_for_then_recorded_as_missing(
    tmp_path: Path,
) -> None:
    ledger, bus, trials = InMemoryLedger(), RecordingBus(), stored_trials(tmp_path / "jobs")
    event = await completed("t1", trials, tmp_path)
    await trials.store.delete("e/t1/1.tar.gz")  # expired before the importer got to it

    early = await handle_batch(
        [Incoming(event, delivered=1)], ledger, bus, trials, transient_delay_s=DELAY
    )
    assert early == [nak(DELAY, "transient")] and await ledger.get_record("t1") is None

    late = await handle_batch(
        [Incoming(event, delivered=BUG_MAX_DELIVERIES)],
        ledger,
        bus,
        trials,
        transient_delay_s=DELAY,
    )
    assert late == [ACK]
    record = await ledger.get_record("t1")
    assert record is not None and record.evaluation.exception_type == "ImporterError"
    assert "ObjectMissing" in (record.evaluation.exception_message or "")


async def test_an_external_trial_is_read_from_a_scratch_copy_not_mirrored(
    tmp_path: Path,
) -> None:
    ledger, bus, trials = InMemoryLedger(), RecordingBus(), stored_trials(tmp_path / "jobs")
    runner_event = TrialCompleted.model_validate_json(await completed("t1", trials, tmp_path))
    external = runner_event.model_copy(update={"source": "external"})

    await handle_batch(
        [Incoming(encode_event(external))], ledger, bus, trials, transient_delay_s=DELAY
    )

    record = await ledger.get_record("t1")
    assert record is not None and record.provenance.source == "external"
    assert record.artifacts.trial_dir is None and record.artifacts.archive == external.result
    # Its own job folder is on the watcher's machine: nothing lands under jobs/<exp>.
    assert not (tmp_path / "jobs" / "e").exists()
    assert list((tmp_path / "jobs" / ".scratch").iterdir()) == []


@pytest.mark.parametrize("made_by_trialbus", [True, False])
async def test_completion_writes_harbor_job_result_for_trialbus_jobs_only(
    tmp_path: Path, made_by_trialbus: bool
) -> None:
    jobs = tmp_path / "jobs"
    job_dir = jobs / "exp"
    job_dir.mkdir(parents=True)
    if made_by_trialbus:
        (job_dir / "trialbus.json").write_text(json.dumps({"experiment_id": "exp"}))
    done = ExperimentCompleted(experiment_id="exp", n_trials=1, n_scored=0, n_partial=1)

    settles = await handle_batch(
        [Incoming(encode_event(done))],
        InMemoryLedger(),
        RecordingBus(),
        stored_trials(jobs),
        transient_delay_s=DELAY,
    )

    assert settles == [ACK]
    result = job_dir / "result.json"
    assert result.is_file() is made_by_trialbus
    if made_by_trialbus:
        written = json.loads(result.read_text())
        assert written["n_total_trials"] == 1 and written["finished_at"]
