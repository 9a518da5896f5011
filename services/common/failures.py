"""Failure classes, following Harbor's own classification of exceptions.

Harbor keeps only the first exception of a trial and, in its job retry config,
excludes from retries the exceptions that are *results* (agent timeouts, verifier
outcomes, model/auth errors). trialbus mirrors that list: those are scored or are
the agent's fault; everything else is infrastructure and may be retried.
"""

from __future__ import annotations

from schemas.record import FailureClass

# The agent's fault: the trial is scored (reward 0 when the verifier gives none).
AGENT_EXCEPTIONS = frozenset(
    {
        "AgentTimeoutError",
        "AgentSetupTimeoutError",
        "NonZeroAgentExitCodeError",
        "ApiError",
        "ApiRateLimitError",
        "ApiUsageLimitError",
        "ApiInternalServerError",
        "AgentSafetyRefusalError",
        "AgentAuthenticationError",
        "ModelNotFoundError",
        "UnsupportedModelParametersError",
        "ContextLengthExceededError",
        "OutputLengthExceededError",
    }
)

# The verifier did not produce a usable reward: unscored, not retried.
VERIFIER_EXCEPTIONS = frozenset(
    {
        "VerifierTimeoutError",
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
        "AddTestsDirError",
        "DownloadVerifierDirError",
    }
)

# Harbor's default job retry config excludes these from retries.
NOT_RETRYABLE = frozenset(
    {
        "AgentTimeoutError",
        "VerifierTimeoutError",
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
        "ApiUsageLimitError",
        "AgentSafetyRefusalError",
        "AgentAuthenticationError",
        "ModelNotFoundError",
        "UnsupportedModelParametersError",
        # Environment definitions that cannot build will not build on a retry either.
        "SandboxBuildFailedError",
        "LocalEnvironmentError",
    }
)


def classify(exception_type: str | None) -> FailureClass:
    """Failure class of a Harbor exception type name (None: no exception)."""
    if not exception_type:
        return "none"
    if exception_type in ("CancelledError", "TrialCancelled"):
        return "cancelled"
    if exception_type in AGENT_EXCEPTIONS:
        return "agent"
    if exception_type in VERIFIER_EXCEPTIONS:
        return "verifier"
    return "infrastructure"


def is_retryable(exception_type: str | None) -> bool:
    """Whether a fresh attempt could change the outcome (transient infrastructure)."""
    return classify(exception_type) == "infrastructure" and exception_type not in NOT_RETRYABLE
