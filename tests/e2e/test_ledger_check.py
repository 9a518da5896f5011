"""Negative controls for the fault checker (tests/e2e/ledger_check.py).

A checker that cannot fail proves nothing. Each defect the fault tests claim to rule
out is planted here, first in small hand-made histories (fast, exact), then in a real
run: a second TrialCompleted for a finished run published on the real bus, and a
conflicting record written into the real ledger behind the importer's back. Each must
be reported; the same histories without the plant must pass.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schemas.events import (
    Event,
    ResultImported,
    TrialCompleted,
    TrialStarted,
    encode_event,
)
from schemas.objects import ObjectRef
from schemas.record import Artifacts, Evaluation, PhaseTiming, Provenance, TrialRecord
from services.common.adapters.mongo_ledger import MongoLedger
from tests.e2e.conftest import Stacks
from tests.e2e.events import connect
from tests.e2e.faultkit import instant_runner_env, judge, ledger_records, submit, write_manifest
from tests.e2e.ledger_check import check_ledger
from tests.support.event_builders import result_imported, trial_failed

EXP = "exp-1"
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def started(trial: str, attempt: int, when: float, runner: str = "runner-0") -> TrialStarted:
    return TrialStarted(
        experiment_id=EXP,
        trial_id=trial,
        runner_id=runner,
        host="h",
        attempt=attempt,
        run_id=trial,
        occurred_at=at(when),
    )


def stored(trial: str, attempt: int) -> ObjectRef:
    """The results-bucket reference of one attempt's trial folder."""
    return ObjectRef(
        bucket="RESULTS", name=f"{EXP}/{trial}/{attempt}.tar.gz", size=1, sha256="ab" * 32
    )


def completed(trial: str, attempt: int, when: float) -> TrialCompleted:
    return TrialCompleted(
        experiment_id=EXP,
        trial_id=trial,
        result=stored(trial, attempt),
        trial_name=trial,
        attempt=attempt,
        run_id=trial,
        occurred_at=at(when),
    )


def imported(trial: str, changed: bool = True) -> ResultImported:
    return result_imported(trial, experiment_id=EXP, changed=changed)


def record(trial: str, attempt: int, finished: float, reward: float = 1.0) -> TrialRecord:
    return TrialRecord(
        trial_id=trial,
        experiment_id=EXP,
        status="complete",
        provenance=Provenance(task_name="hello-file", agent_name="nop"),
        timing=PhaseTiming(started_at=at(finished - 1), finished_at=at(finished)),
        evaluation=Evaluation(rewards={"reward": reward}, main_reward=reward, reward_valid=True),
        artifacts=Artifacts(archive=stored(trial, attempt)),
        attempts=attempt,
    )


def healthy(n: int = 3) -> tuple[set[str], list[Event], list[TrialRecord]]:
    """n trials, each started, completed, imported once and recorded."""
    trials = {f"t{i}" for i in range(n)}
    events: list[Event] = []
    records = []
    for i, t in enumerate(sorted(trials)):
        events += [started(t, 1, 10 * i), completed(t, 1, 10 * i + 2), imported(t)]
        records.append(record(t, 1, 10 * i + 1.5))
    return trials, events, records


def test_a_healthy_history_passes() -> None:
    check = check_ledger(EXP, *healthy())
    assert check.ok, check.explain()
    assert (check.submitted, check.ledgered, check.duplicates, check.stale) == (3, 3, 0, 0)


def test_replays_and_reruns_are_not_duplicates() -> None:
    trials, events, records = healthy()
    # An importer killed after writing: the redelivered event changes nothing.
    events.append(imported("t0", changed=False))
    # A runner killed mid-trial: attempt 1 never ended, attempt 2 ran elsewhere.
    events += [started("t9", 1, 100), started("t9", 2, 110, "runner-1")]
    events += [completed("t9", 2, 112), imported("t9")]
    records.append(record("t9", 2, 111.5))
    check = check_ledger(EXP, trials | {"t9"}, events, records)
    assert check.ok, check.explain()
    assert check.reruns == 1


def test_a_second_completion_of_a_run_is_a_duplicate() -> None:
    trials, events, records = healthy()
    events.append(completed("t1", 2, 13))
    check = check_ledger(EXP, trials, events, records)
    assert check.duplicates == 1 and not check.ok
    assert "run t1 ended 2 times" in check.explain()


def test_completed_and_final_failure_of_one_run_is_a_duplicate() -> None:
    trials, events, records = healthy()
    events.append(
        trial_failed(
            "t2",
            experiment_id=EXP,
            failure_class="cancelled",
            error_type="Cancelled",
            message="",
            run_id="t2",
        )
    )
    assert check_ledger(EXP, trials, events, records).duplicates == 1


def test_a_record_changed_again_after_it_was_complete_is_a_duplicate() -> None:
    trials, events, records = healthy()
    events.append(imported("t0", changed=True))
    check = check_ledger(EXP, trials, events, records)
    assert check.duplicates == 1
    assert "record changed by 2 imports for 1 run(s)" in check.explain()


def test_a_record_of_an_earlier_attempt_is_stale() -> None:
    trials, events, records = healthy()
    events += [started("t0", 2, 30), completed("t0", 2, 32)]
    check = check_ledger(EXP, trials, events, records)
    assert check.stale == 1
    assert "attempt 1, the last run ended at attempt 2" in check.explain()


def test_a_result_from_outside_its_run_is_stale() -> None:
    trials, events, records = healthy()
    records[1] = record("t1", 1, finished=50)  # written after the run had completed
    assert check_ledger(EXP, trials, events, records).stale == 1
    records[1] = record("t1", 1, finished=1)  # before the run started (at 10)
    assert check_ledger(EXP, trials, events, records).stale == 1


def test_a_record_written_behind_the_importer_is_stale() -> None:
    trials, events, records = healthy()
    records[2] = record("t2", 1, 21.5, reward=0.0)  # the importer announced 1.0
    check = check_ledger(EXP, trials, events, records)
    assert check.stale == 1
    assert "!= announced" in check.explain()


def test_missing_and_unexpected_trials_are_reported() -> None:
    trials, events, records = healthy()
    check = check_ledger(EXP, trials | {"t7"}, events, records)
    assert (check.missing, check.unexpected) == (1, 0)
    assert "missing: trial t7 has no record" in check.explain()
    check = check_ledger(EXP, trials - {"t0"}, events, records)
    assert check.unexpected == 1


@pytest.mark.e2e
async def test_checker_reports_duplicates_planted_in_a_real_run(
    stacks: Stacks, tmp_path: Path
) -> None:
    stack = await stacks.start(concurrency=4, runner_env=instant_runner_env(0.0))
    tap = await stacks.tap(stack)
    sub = await submit(stacks.cli(stack), write_manifest(tmp_path, 4, name="control"))
    await tap.all_imported(sub.experiment_id, set(sub.trial_ids), 60)
    clean = await judge("control: before planting", stack, sub)
    assert clean.ok, clean.explain()

    # Plant 1: a finished run completes a second time (a new attempt, so JetStream's
    # dedup window does not drop it). The importer accepts it: the record changes again.
    first = next(e for e in tap.events if isinstance(e, TrialCompleted))
    again = first.model_copy(update={"attempt": first.attempt + 1, "event_id": "planted"})
    mark = tap.mark()
    nc = await connect(stack.nats_url or "")
    try:
        await nc.jetstream().publish(
            tap.topology.event_subject(again.type, again.experiment_id),
            encode_event(again),
            headers={"Nats-Msg-Id": again.dedup_id()},
        )
    finally:
        await nc.close()
    await tap.eventually(
        lambda evs: any(
            isinstance(e, ResultImported) and e.trial_id == first.trial_id for e in evs[mark:]
        ),
        "the planted completion imported",
        30,
    )
    planted = await judge("control: second completion planted", stack, sub)
    assert planted.duplicates == 2, planted.explain()  # the run ended twice; changed twice
    assert f"run {first.run_id or first.trial_id} ended 2 times" in planted.explain()

    # Plant 2: a conflicting record written straight into the ledger.
    victim = next(
        r for r in await ledger_records(stack, sub.experiment_id) if r.trial_id != first.trial_id
    )
    forged = victim.model_copy(
        update={"evaluation": victim.evaluation.model_copy(update={"main_reward": 0.25})}
    )
    ledger = MongoLedger(stack.ledger_url or "", stack.ledger_db)
    try:
        await ledger.upsert_records([forged])
    finally:
        await ledger.close()
    forged_check = await judge("control: conflicting record planted", stack, sub)
    assert forged_check.stale == 1, forged_check.explain()
    assert f"stale: trial {victim.trial_id}" in forged_check.explain()
