"""Ledger records: built for unit tests of the reports and the submitter, read back
from a real ledger for the integration and end-to-end tests."""

from __future__ import annotations

import itertools

from schemas.record import (
    Evaluation,
    FailureClass,
    Provenance,
    RecordStatus,
    TrialRecord,
    Usage,
)
from services.common.adapters.mongo_ledger import MongoLedger

_trial_ids = itertools.count()


def single_reward(
    reward: float | None, failure: FailureClass = "none", exception: str | None = None
) -> Evaluation:
    """An evaluation with one ``reward`` key, or none (unscored) when ``reward`` is None."""
    return Evaluation(
        rewards={} if reward is None else {"reward": reward},
        main_reward_key=None if reward is None else "reward",
        main_reward=reward,
        reward_valid=reward is not None,
        failure_class=failure,
        exception_type=exception,
    )


def report_record(
    evaluation: Evaluation,
    *,
    task: str = "task",
    agent: str = "oracle",
    model: str | None = None,
    label: str | None = None,
    status: RecordStatus = "complete",
    usage: Usage | None = None,
) -> TrialRecord:
    """A record of experiment ``exp`` under a trial id of its own (the reports group
    records by task, agent and model; the id only has to differ)."""
    return TrialRecord(
        trial_id=f"t{next(_trial_ids)}",
        experiment_id="exp",
        status=status,
        provenance=Provenance(task_name=task, agent_name=agent, agent_label=label, model=model),
        evaluation=evaluation,
        usage=usage or Usage(),
    )


def passed_record(i: int) -> TrialRecord:
    """Trial ``hello__<i>`` of experiment ``exp``: oracle passed task hello (the status
    tests count such records against the trials an experiment expects)."""
    return TrialRecord(
        trial_id=f"hello__{i}",
        experiment_id="exp",
        status="complete",
        provenance=Provenance(task_name="hello", agent_name="oracle"),
        evaluation=single_reward(1.0),
    )


async def records_in(ledger_url: str, ledger_db: str, experiment_id: str) -> list[TrialRecord]:
    """The experiment's records, read through the ledger adapter."""
    ledger = MongoLedger(ledger_url, ledger_db)
    try:
        return await ledger.records_for(experiment_id)
    finally:
        await ledger.close()
