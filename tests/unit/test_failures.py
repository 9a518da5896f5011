"""Failure class and retryability of Harbor exception type names.

The expectations are written out by hand (not derived from Harbor's table) so that a
change in Harbor's classification, or in trialbus's mapping of it, shows up here.
"""

from __future__ import annotations

import pytest
from harbor.models.trial.error_policy import ERROR_POLICIES

from schemas.record import FailureClass
from services.common.failures import classify, harbor_cause, is_retryable


@pytest.mark.parametrize(
    ("exception_type", "failure_class", "retryable"),
    [
        (None, "none", False),
        ("", "none", False),
        ("CancelledError", "cancelled", False),
        # The agent's own outcome: a valid, scored result; a retry would be re-rolling.
        ("AgentTimeoutError", "agent", False),
        ("ContextLengthExceededError", "agent", False),
        ("OutputLengthExceededError", "agent", False),
        ("ContextWindowExceededError", "agent", False),
        ("AgentSafetyRefusalError", "agent", False),
        ("ContentPolicyViolationError", "agent", False),
        # The verifier gave no usable reward: unscored, and retrying will not help.
        ("VerifierTimeoutError", "verifier", False),
        ("RewardFileNotFoundError", "verifier", False),
        ("RewardFileEmptyError", "verifier", False),
        ("VerifierOutputParseError", "verifier", False),
        # Sandbox trouble: transient, retried.
        ("EnvironmentStartTimeoutError", "infrastructure", True),
        ("SandboxBuildFailedError", "infrastructure", True),
        ("AgentSetupTimeoutError", "infrastructure", True),
        ("AddTestsDirError", "infrastructure", True),
        ("DownloadVerifierDirError", "infrastructure", True),
        # Model provider trouble: unscored; retried unless it is a configuration error.
        ("ApiError", "infrastructure", True),
        ("ApiRateLimitError", "infrastructure", True),
        ("ApiUsageLimitError", "infrastructure", True),
        ("AgentAuthenticationError", "infrastructure", False),
        ("ModelNotFoundError", "infrastructure", False),
        ("BadRequestError", "infrastructure", False),
        # Harbor itself cannot run this trial.
        ("ServiceOperationsUnsupportedError", "infrastructure", False),
        # Harbor cannot say whose fault: trialbus treats it as infrastructure.
        ("NonZeroAgentExitCodeError", "infrastructure", True),
        # trialbus's own deterministic failures.
        ("LocalEnvironmentError", "infrastructure", False),
        ("MissingSecretError", "infrastructure", False),
        # The local sandbox's disk quota: the agent spent a budget, like a timeout.
        ("DiskQuotaExceededError", "agent", False),
        # Anything unknown: infrastructure, retried.
        ("ConnectionResetError", "infrastructure", True),
        ("SomethingHarborAddsLater", "infrastructure", True),
        ("agenttimeouterror", "infrastructure", True),  # names are case-sensitive
    ],
)
def test_classify_and_retry(
    exception_type: str | None, failure_class: FailureClass, retryable: bool
) -> None:
    assert classify(exception_type) == failure_class
    assert is_retryable(exception_type) is retryable


@pytest.mark.parametrize(
    ("exception_type", "cause"),
    [
        (None, None),
        ("AgentTimeoutError", "agent_exhausted_budget"),
        ("RewardFileNotFoundError", "verifier_failed"),
        ("NonZeroAgentExitCodeError", "unclassified"),
        ("NoSuchError", "unclassified"),
    ],
)
def test_harbor_cause(exception_type: str | None, cause: str | None) -> None:
    assert harbor_cause(exception_type) == cause


@pytest.mark.parametrize("name", sorted(ERROR_POLICIES))
def test_every_harbor_name_keeps_the_scoring_rules(name: str) -> None:
    # Only the agent's own outcomes are scored, and a scored result is never retried.
    failure_class = classify(name)
    assert (failure_class == "agent") is ERROR_POLICIES[name].reward_valid
    if is_retryable(name):
        assert failure_class == "infrastructure"
