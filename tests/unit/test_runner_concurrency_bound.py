"""A runner process may hold as many trials as one experiment may run at once.

Waiting trials are cheap (docs/performance.md, capacity: about 22 KiB each), and the
capacity benchmark's one-runner point holds all 10,000 of an experiment; the bound
was once 4,096, below what a manifest may ask, and that runner refused to start.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.manifest import MAX_CONCURRENT_TRIALS, ComputeSpec
from services.common.settings import RunnerSettings


def test_a_runner_may_hold_every_trial_an_experiment_may_run_at_once() -> None:
    most = ComputeSpec(n_concurrent_trials=MAX_CONCURRENT_TRIALS).n_concurrent_trials
    assert RunnerSettings(concurrency=most).concurrency == most == 10_000


def test_past_the_bound_the_setting_is_refused_by_name() -> None:
    # The control: the bound still binds.
    with pytest.raises(ValidationError, match="concurrency"):
        RunnerSettings(concurrency=MAX_CONCURRENT_TRIALS + 1)
