"""The watcher's pure helpers: RecordTally, completion_of, finished_external_jobs.

Against the in-memory ledger (the same rules as MongoLedger: the contract suite in
tests/integration/test_ledger_contract.py runs against both).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.record import Evaluation, Provenance, TrialRecord
from services.common.adapters.memory import InMemoryLedger
from services.common.ports import ExperimentInfo
from services.watcher.logic import RecordTally, completion_of, finished_external_jobs


def record(trial_id: str, *, scored: bool = True, experiment_id: str = "exp") -> TrialRecord:
    """A ledger record: complete and scored, or partial and unscored."""
    return TrialRecord(
        trial_id=trial_id,
        experiment_id=experiment_id,
        status="complete" if scored else "partial",
        provenance=Provenance(task_name="t", agent_name="oracle", source="runner"),
        evaluation=Evaluation(
            rewards={"reward": 1.0} if scored else {},
            main_reward_key="reward" if scored else None,
            main_reward=1.0 if scored else None,
            reward_valid=scored,
            failure_class="none" if scored else "infrastructure",
        ),
    )


async def ledger_with(n_trials: int, records: list[TrialRecord]) -> InMemoryLedger:
    ledger = InMemoryLedger()
    await ledger.upsert_experiment(ExperimentInfo("exp", "Exp", n_trials, {}))
    await ledger.upsert_records(records)
    return ledger


# -- RecordTally ---------------------------------------------------------------------------


def test_tally_without_a_count_allows_completion() -> None:
    assert RecordTally().may_be_complete(10)


def test_tally_bounds_the_records_from_the_last_count_and_the_imports_since() -> None:
    tally = RecordTally(counted=7, since={"a", "b"})
    assert not tally.may_be_complete(10)  # at most 9 records
    tally.since.add("c")
    assert tally.may_be_complete(10)
    tally.since.add("c")  # the same trial imported twice counts once
    assert tally.counted == 7 and len(tally.since) == 3


def test_tally_reset_starts_from_the_exact_count() -> None:
    tally = RecordTally(counted=1, since={"a", "b"})
    tally.reset(3)
    assert tally.counted == 3 and tally.since == set()
    assert not tally.may_be_complete(4)
    assert tally.may_be_complete(3)


# -- completion_of -------------------------------------------------------------------------


async def test_unknown_experiment_is_never_complete() -> None:
    ledger = InMemoryLedger()
    await ledger.upsert_records([record("a")])  # records, but no submission seen
    assert await completion_of(ledger, "exp") is None


async def test_incomplete_experiment_is_not_complete() -> None:
    ledger = await ledger_with(3, [record("a"), record("b")])
    assert await completion_of(ledger, "exp") is None


async def test_complete_experiment_counts_scored_and_partial_records() -> None:
    ledger = await ledger_with(3, [record("a"), record("b"), record("c", scored=False)])
    done = await completion_of(ledger, "exp", "corr-1")
    assert done is not None
    assert (done.experiment_id, done.correlation_id) == ("exp", "corr-1")
    assert (done.n_trials, done.n_scored, done.n_partial) == (3, 2, 1)


async def test_records_of_other_experiments_do_not_complete_this_one() -> None:
    ledger = await ledger_with(2, [record("a"), record("x", experiment_id="other")])
    assert await completion_of(ledger, "exp") is None


async def test_a_tally_below_the_size_spares_the_ledger_count() -> None:
    ledger = await ledger_with(2, [record("a"), record("b")])
    # The ledger is complete, but the tally says at most 1 record: not asked.
    low = RecordTally(counted=0, since={"a"})
    assert await completion_of(ledger, "exp", tally=low) is None
    assert low.counted == 0 and low.since == {"a"}  # untouched: no count was made
    # Negative control: a tally that allows completion asks, and is reset to the count.
    high = RecordTally(counted=0, since={"a", "b"})
    assert await completion_of(ledger, "exp", tally=high) is not None
    assert high.counted == 2 and high.since == set()


async def test_a_tally_that_allows_completion_is_reset_even_when_incomplete() -> None:
    ledger = await ledger_with(3, [record("a")])
    tally = RecordTally(counted=None, since={"a", "b", "c"})
    assert await completion_of(ledger, "exp", tally=tally) is None
    assert tally.counted == 1 and tally.since == set()
    assert not tally.may_be_complete(3)


# -- finished_external_jobs ----------------------------------------------------------------


def job(jobs_dir: Path, name: str, result: object | None, *, marker: bool = False) -> Path:
    folder = jobs_dir / name
    folder.mkdir(parents=True)
    if result is not None:
        (folder / "result.json").write_text(json.dumps(result))
    if marker:
        (folder / "trialbus.json").write_text(json.dumps({"experiment_id": name}))
    return folder


def test_finished_external_jobs(tmp_path: Path) -> None:
    finished = job(tmp_path, "b-finished", {"finished_at": "2026-01-01T00:00:00Z"})
    job(tmp_path, "a-running", {"finished_at": None})
    job(tmp_path, "c-no-result", None)
    job(tmp_path, "d-trialbus", {"finished_at": "2026-01-01T00:00:00Z"}, marker=True)
    job(tmp_path, ".hidden", {"finished_at": "2026-01-01T00:00:00Z"})
    job(tmp_path, "e-list", ["finished_at"])
    (tmp_path / "f-garbage").mkdir()
    (tmp_path / "f-garbage" / "result.json").write_text("{")
    (tmp_path / "file.json").write_text("{}")
    assert finished_external_jobs(tmp_path) == [finished]


@pytest.mark.parametrize("missing", ["absent", "file"])
def test_finished_external_jobs_without_a_jobs_folder(tmp_path: Path, missing: str) -> None:
    jobs = tmp_path / "jobs"
    if missing == "file":
        jobs.write_text("")
    assert finished_external_jobs(jobs) == []
