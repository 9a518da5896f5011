"""The scoring rule follows Harbor's own: a record's reward_valid equals Harbor's
``TrialResult.reward_valid`` for every exception type Harbor classifies, on real
result.json files that Harbor wrote (tests/harbor_fixtures.py), varied one field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trial.error_policy import ERROR_POLICIES, policy_for
from harbor.models.trial.result import TrialResult

from services.common.failures import NEVER_SCORED, NOT_RETRYABLE_TRIALBUS, classify
from services.importer.records import RecordContext, build_record
from tests.harbor_fixtures import HarborTrials

EVERY_TYPE = [
    *sorted(ERROR_POLICIES),
    "SomethingHarborNeverHeardOf",
    *sorted(NOT_RETRYABLE_TRIALBUS),
]


@pytest.mark.parametrize("exception_type", EVERY_TYPE)
def test_scored_classes_are_exactly_harbors_reward_valid_causes(exception_type: str) -> None:
    # trialbus's own agent failures (the disk quota) are class "agent" yet never scored:
    # Harbor does not know their names, and the rule below keeps its word.
    scored = classify(exception_type) in ("none", "agent") and exception_type not in NEVER_SCORED
    assert scored is policy_for(exception_type).reward_valid


def _exception(exception_type: str) -> dict[str, Any]:
    return {
        "exception_type": exception_type,
        "exception_message": "injected by the test",
        "exception_traceback": "",
        "occurred_at": "2026-01-02T03:04:05Z",
    }


def _variant(harbor_trials: HarborTrials, tmp_path: Path, name: str, **fields: Any) -> Path:
    trial = harbor_trials.copy("oracle", tmp_path, name)
    data = json.loads((trial / "result.json").read_text())
    data.update(fields)
    (trial / "result.json").write_text(json.dumps(data))
    return trial


def _both(trial: Path) -> tuple[bool, bool, str]:
    ours = build_record(trial, RecordContext(experiment_id="e", trial_id=trial.name)).evaluation
    harbor = TrialResult.model_validate_json((trial / "result.json").read_text())
    return ours.reward_valid, harbor.reward_valid, ours.failure_class


def test_real_fixture_trials_agree_with_harbor(harbor_trials: HarborTrials) -> None:
    for name, trial in harbor_trials.trials.items():
        ours, harbors, _ = _both(trial)
        assert ours is harbors, name


def test_every_exception_type_on_a_rewarded_trial_agrees_with_harbor(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    for i, exception_type in enumerate(EVERY_TYPE):
        trial = _variant(
            harbor_trials, tmp_path, f"t{i}", exception_info=_exception(exception_type)
        )
        ours, harbors, failure = _both(trial)
        assert ours is harbors, exception_type
        assert failure == classify(exception_type)


@pytest.mark.parametrize(
    ("trial_exception", "step_exceptions", "scored", "failure"),
    [
        (None, ["AgentTimeoutError"], True, "agent"),
        ("AgentTimeoutError", ["AgentSafetyRefusalError"], True, "agent"),
        # A later step's infrastructure failure unscores the trial, and is its cause.
        ("AgentTimeoutError", ["ApiConnectionError"], False, "infrastructure"),
        (None, ["AgentTimeoutError", "RewardFileNotFoundError"], False, "verifier"),
        (None, ["SandboxBuildFailedError", "AgentTimeoutError"], False, "infrastructure"),
    ],
)
def test_multi_step_exceptions_agree_with_harbor(
    harbor_trials: HarborTrials,
    tmp_path: Path,
    trial_exception: str | None,
    step_exceptions: list[str],
    scored: bool,
    failure: str,
) -> None:
    steps = [
        {"step_name": f"step-{i}", "exception_info": _exception(t)}
        for i, t in enumerate(step_exceptions)
    ]
    trial = _variant(
        harbor_trials,
        tmp_path,
        "multi-step",
        exception_info=_exception(trial_exception) if trial_exception else None,
        step_results=steps,
    )
    ours, harbors, ours_failure = _both(trial)
    assert ours is harbors is scored
    assert ours_failure == failure
