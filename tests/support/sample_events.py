"""One instance of every event type, with fixed event ids and timestamps.

The golden wire-format test (tests/unit/test_schema_golden.py) holds the exact bytes
and dedup ids of these instances; the event contract tests (tests/unit/test_events.py)
round-trip them. Changing one here changes the golden: that test then says so.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas import events
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from schemas.objects import ObjectRef

WHEN = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
TASK = events.TaskRef(name="hello-file", checksum="ab" * 32)
RESULT = ObjectRef(
    bucket="TRIALBUS_RESULTS", name="exp-1/t1:resume:2/3.tar.gz", size=2048, sha256="cd" * 32
)
AGENT = AgentSpec(
    name="terminus-2",
    model="anthropic/claude-sonnet-4",
    label="t2",
    kwargs={"temperature": 0.5, "nested": {"a": [1, 2]}},
    api_key_env=["ANTHROPIC_API_KEY"],
)


STARTED_BY: dict[str, Any] = {"trial_id": "t1", "runner_id": "r-1", "host": "node-a"}
"""The trial and the runner of the sample starts."""
NAMED_RUN: dict[str, Any] = {
    "task_name": "hello-file",
    "agent_label": "t2",
    "model": "anthropic/claude-sonnet-4",
}
"""What a start names of its run (runners since the fields exist)."""
RETRYABLE_FAILURE: dict[str, Any] = {
    "trial_id": "t1",
    "failure_class": "agent",
    "error_type": "X",
    "message": "m",
}
"""A failure another attempt may mend, with no optional field (their defaults' bytes)."""


def env(n: int) -> dict[str, Any]:
    """Envelope fields with a fixed event_id and timestamp (the defaults are random)."""
    return {
        "event_id": f"{n:032x}",
        "occurred_at": WHEN,
        "experiment_id": "exp-1",
        "correlation_id": "corr-1",
    }


def minimal_request() -> dict[str, Any]:
    """TrialRequested's required fields but the agent, at their plainest: the variants
    below add the one field each is about."""
    return {
        "trial_id": "t1",
        "task": TASK,
        "repetition": 0,
        "compute": ComputeSpec(),
        "retry": RetrySpec(),
    }


def instances() -> dict[str, events.Envelope]:
    """Every event type; run events both with and without a resume run_id."""
    return {
        "experiment_submitted": events.ExperimentSubmitted(
            **env(1),
            name="demo",
            n_trials=6,
            n_published=4,
            manifest={"name": "demo", "repetitions": 3},
        ),
        "trial_requested": events.TrialRequested(
            **env(2),
            trial_id="hello-file__0123456789abcdef",
            task=TASK,
            agent=AGENT,
            repetition=2,
            compute=ComputeSpec(
                environment="docker", n_concurrent_trials=8, environment_kwargs={"cpus": 2}
            ),
            retry=RetrySpec(max_attempts=5),
            experiment_trials=12,
        ),
        "trial_requested_resumed": events.TrialRequested(
            **env(3),
            **minimal_request(),
            agent=AgentSpec(import_path="pkg.mod:Agent"),
            run_id="t1:resume:2",
        ),
        "trial_requested_team": events.TrialRequested(
            **env(15),
            **minimal_request(),
            agent=AgentSpec(name="oracle"),
            team=events.TeamRef(
                name="red.team", max_concurrent_trials=4, max_spend_usd_per_day=25.0
            ),
        ),
        "trial_started": events.TrialStarted(**env(4), **STARTED_BY, attempt=2),
        "trial_started_resumed": events.TrialStarted(
            **env(5), **STARTED_BY, attempt=1, run_id="t1:resume:2"
        ),
        "trial_started_named": events.TrialStarted(**env(16), **STARTED_BY, attempt=1, **NAMED_RUN),
        "trial_log": events.TrialLog(
            **env(6), trial_id="t1", phase="agent", stream="stderr", text='h\u00e9llo "q"\n'
        ),
        "trial_completed": events.TrialCompleted(
            **env(7),
            trial_id="t1",
            result=RESULT,
            trial_name="t1",
            source="external",
            runner_host="node-a",
            harbor_version="0.1.0",
            environment="docker",
            agent_label="mine",
            attempt=3,
            repetition=1,
            run_id="t1:resume:2",
            task=TASK,  # since the field exists (its bytes changed with it)
        ),
        "trial_completed_defaults": events.TrialCompleted(
            **env(8), trial_id="t1", result=RESULT, trial_name="t1"
        ),
        "trial_failed": events.TrialFailed(
            **env(9),
            trial_id="t1",
            failure_class="infrastructure",
            error_type="SandboxBuildFailedError",
            message="build failed",
            attempt=1,
            final=True,
            result=RESULT,
            task=TASK,
            agent=AGENT,
            repetition=0,
            runner_host="node-b",
            run_id="t1:resume:2",
        ),
        "trial_failed_retry": events.TrialFailed(
            **env(10), **RETRYABLE_FAILURE, attempt=2, final=False
        ),
        "result_imported": events.ResultImported(
            **env(11), trial_id="t1", status="complete", scored=True, main_reward=0.75, changed=True
        ),
        "result_imported_partial": events.ResultImported(
            **env(12),
            trial_id="t1",
            status="partial",
            scored=False,
            main_reward=None,
            changed=False,
        ),
        "experiment_completed": events.ExperimentCompleted(
            **env(13), n_trials=6, n_scored=5, n_partial=1
        ),
    }
