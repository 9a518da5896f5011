"""Pause and resume ONE trial of an experiment (docs/scheduling.md).

The experiment's own pause is services.submitter.handlers.pause; this holds back a
single queued trial the same way: a runner hands its work message back unstarted (no
lease, no attempt counted) while its id is among the experiment's paused trials
(``Coordinator.pause_trial``), and runs it as usual once resumed. A running trial is
not stopped (that would be preemption), and a cancellation still wins.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import UserInputError
from services.common.ports import Coordinator, Ledger
from services.submitter.live_feeds import valid_trial_id


async def _check(ledger: Ledger, experiment_id: str, trial_id: str) -> tuple[bool, bool]:
    """(whether the ledger knows the experiment, whether the trial has its record).

    Raises UserInputError for an id no trial can have, or a trial the ledger records
    under another experiment (its pause would never be looked at)."""
    if not valid_trial_id(trial_id):
        raise UserInputError(
            f"{trial_id!r} is not a trial id (the ids are in `trialbus status "
            f"{experiment_id} --json` or the experiment's page)"
        )
    record = await ledger.get_record(trial_id)
    if record is not None and record.experiment_id != experiment_id:
        raise UserInputError(
            f"trial {trial_id} belongs to experiment {record.experiment_id}, not {experiment_id}"
        )
    known = await ledger.get_experiment(experiment_id) is not None
    return known, record is not None


async def pause_trial(
    ledger: Ledger, coordinator: Coordinator, experiment_id: str, trial_id: str
) -> dict[str, Any]:
    """Flag one trial paused: runners hand its queued work back until ``resume_trial``.
    ``already_recorded``: the trial has finished (a later retry of it would wait)."""
    known, recorded = await _check(ledger, experiment_id, trial_id)
    await coordinator.pause_trial(experiment_id, trial_id)
    return {
        "experiment_id": experiment_id,
        "trial_id": trial_id,
        "paused": True,
        "known": known,
        "already_recorded": recorded,
    }


async def resume_trial(
    ledger: Ledger, coordinator: Coordinator, experiment_id: str, trial_id: str
) -> dict[str, Any]:
    """Lift one trial's pause: it starts within seconds (after its hand-back delay)."""
    known, _ = await _check(ledger, experiment_id, trial_id)
    was_paused = await coordinator.resume_trial(experiment_id, trial_id)
    return {
        "experiment_id": experiment_id,
        "trial_id": trial_id,
        "paused": False,
        "was_paused": was_paused,
        "known": known,
    }
