"""Ledger records for unit tests of the reports and the submitter."""

from __future__ import annotations

from schemas.record import Evaluation, FailureClass


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
