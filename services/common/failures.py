"""Failure classes, taken from Harbor's own classification of exceptions.

Harbor 0.25 keeps one table (``harbor.models.trial.error_policy``) that says, per
exception type name, who ended the trial, whether a retry may help and whether the
reward is a valid measurement. trialbus uses that table as it is and maps Harbor's
causes onto the four classes its records and reports use:

=============================================  ==================  =========
Harbor cause                                   trialbus class      scored
=============================================  ==================  =========
agent_exhausted_budget, agent_refused_task     agent               yes
verifier_failed                                verifier            no
cancelled                                      cancelled           no
sandbox_failed, model_provider_failed,         infrastructure      no
harbor_failed, unclassified
=============================================  ==================  =========

Where Harbor says "unclassified" (e.g. NonZeroAgentExitCodeError: the agent process
failed, but Harbor cannot tell whose fault it is), trialbus decides *infrastructure*:
unscored and retried, never counted as a zero.
"""

from __future__ import annotations

from harbor.models.trial.error_policy import FailureCause, policy_for

from schemas.record import FailureClass

_CLASS_OF_CAUSE: dict[FailureCause, FailureClass] = {
    FailureCause.AGENT_EXHAUSTED_BUDGET: "agent",
    FailureCause.AGENT_REFUSED_TASK: "agent",
    FailureCause.VERIFIER_FAILED: "verifier",
    FailureCause.CANCELLED: "cancelled",
    FailureCause.SANDBOX_FAILED: "infrastructure",
    FailureCause.MODEL_PROVIDER_FAILED: "infrastructure",
    FailureCause.HARBOR_FAILED: "infrastructure",
    FailureCause.UNCLASSIFIED: "infrastructure",
}

# trialbus's own errors that Harbor's table does not know. A task whose environment
# cannot be imitated or built (a failed Dockerfile RUN), a runner without a needed
# secret, or a task whose archive cannot be had, fails the same way on every attempt:
# retrying only wastes time. (The local environment's SandboxStartError stays
# retryable; see services/localenv/errors.py.)
NOT_RETRYABLE_TRIALBUS = frozenset(
    {
        "LocalEnvironmentError",
        "UnsupportedEnvironmentError",
        "DockerfileBuildError",
        "MissingSecretError",
        # The task's archive in the tasks bucket is gone (expired, deleted) or unsafe
        # to unpack: another attempt fetches the same answer.
        "ObjectMissing",
        "ArchiveError",
        "ObjectAccessDenied",
        "RunnerLacksCapability",
        # The runner's policy refused the request (services/common/runner_policy.py):
        # the same request meets the same policy on every attempt.
        "PolicyRefused",
    }
)


def harbor_cause(exception_type: str | None) -> str | None:
    """Harbor's failure cause for an exception type name (None: no exception)."""
    return str(policy_for(exception_type).cause) if exception_type else None


def classify(exception_type: str | None) -> FailureClass:
    """Failure class of a Harbor exception type name (None: no exception)."""
    if not exception_type:
        return "none"
    return _CLASS_OF_CAUSE.get(policy_for(exception_type).cause, "infrastructure")


def is_retryable(exception_type: str | None) -> bool:
    """Whether a fresh attempt could change the outcome (Harbor's retry rule)."""
    if not exception_type or exception_type in NOT_RETRYABLE_TRIALBUS:
        return False
    return bool(policy_for(exception_type).retry)
