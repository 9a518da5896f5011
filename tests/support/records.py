"""Ledger records: built for unit tests of the reports and the submitter, read back
from a real ledger for the integration and end-to-end tests."""

from __future__ import annotations

from schemas.record import Evaluation, FailureClass, TrialRecord
from services.common.adapters.mongo_ledger import MongoLedger


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


async def records_in(ledger_url: str, ledger_db: str, experiment_id: str) -> list[TrialRecord]:
    """The experiment's records, read through the ledger adapter."""
    ledger = MongoLedger(ledger_url, ledger_db)
    try:
        return await ledger.records_for(experiment_id)
    finally:
        await ledger.close()
