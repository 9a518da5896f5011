"""TrialStarted events for tests of the live views' started trials
(services/submitter/live_feeds.py): a trial of an experiment, its attempt, when."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.events import TrialStarted

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def started(
    trial: str, at_s: float = 0, attempt: int = 1, experiment: str = "exp-1"
) -> TrialStarted:
    """``trial``'s start ``attempt`` of ``experiment``, ``at_s`` seconds after T0."""
    return TrialStarted(
        experiment_id=experiment,
        correlation_id="c",
        trial_id=trial,
        attempt=attempt,
        runner_id="r",
        host="h",
        occurred_at=T0 + timedelta(seconds=at_s),
    )
