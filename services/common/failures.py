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

trialbus adds one name of its own: ``DiskQuotaExceededError`` (the local sandbox's
disk quota) is class *agent*, not retried, like Harbor's AgentTimeoutError.

Where Harbor says "unclassified" (e.g. NonZeroAgentExitCodeError: the agent process
failed, but Harbor cannot tell whose fault it is), trialbus decides *infrastructure*:
unscored and retried, never counted as a zero.
"""

from __future__ import annotations

import re

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
        # The agent's name is not one the runner's Harbor ships: a typo, or a Harbor
        # older than the manifest expects; every attempt fails the same way.
        "UnknownAgent",
        # Ended before starting: the agent was stopped, the budget spent
        # (services/runner/guards.py). A resubmission re-runs them.
        "AgentStopped",
        "BudgetExceeded",
        # The local sandbox's disk quota (services/localenv/disk.py): the same agent
        # writes the same bytes again.
        "DiskQuotaExceededError",
    }
)

# trialbus's own errors that are the agent's doing. Past its disk quota a trial spent a
# budget, as with Harbor's AgentTimeoutError (agent_exhausted_budget): class "agent".
# Unlike a timeout it is never scored: the sandbox is ended before the verifier runs,
# and Harbor (which does not know the name) says its reward is not valid.
# A runner's attempt that crashed (its executor raised: services/runner/handlers.py
# ``crashed``) is the infrastructure's, whatever the exception it raised was called:
# retried, never scored.
RUNNER_CRASHED = "RunnerCrashedError"
_TRIALBUS_CLASSES: dict[str, FailureClass] = {
    "DiskQuotaExceededError": "agent",
    RUNNER_CRASHED: "infrastructure",
}
NEVER_SCORED = frozenset(_TRIALBUS_CLASSES)
"""trialbus's own failures, which Harbor's ``reward_valid`` never counts (the scoring
rule agrees)."""


def harbor_cause(exception_type: str | None) -> str | None:
    """Harbor's failure cause for an exception type name (None: no exception)."""
    return str(policy_for(exception_type).cause) if exception_type else None


def classify(exception_type: str | None) -> FailureClass:
    """Failure class of a Harbor exception type name (None: no exception)."""
    if not exception_type:
        return "none"
    if exception_type in _TRIALBUS_CLASSES:
        return _TRIALBUS_CLASSES[exception_type]
    return _CLASS_OF_CAUSE.get(policy_for(exception_type).cause, "infrastructure")


def is_retryable(exception_type: str | None) -> bool:
    """Whether a fresh attempt could change the outcome (Harbor's retry rule)."""
    if not exception_type or exception_type in NOT_RETRYABLE_TRIALBUS:
        return False
    return bool(policy_for(exception_type).retry)


# -- errors that stop an agent's remaining trials ------------------------------------
# A provider that refuses the agent's credentials, or an account with no credit left,
# fails every trial of that agent configuration in the experiment the same way:
# running the rest only burns time (and, with a quota, the user's patience). The first
# such failure stops the agent's remaining trials in the experiment (services/runner/
# guards.py). Rate limits and server errors (429 without a quota code, 5xx) pass on
# their own and never stop an agent.

# By exception type name: Harbor's and litellm's names for a refused key or account.
STOPS_AGENT_AUTH = frozenset(
    {
        "AuthenticationError",  # litellm / openai: HTTP 401, invalid API key
        "PermissionDeniedError",  # litellm / openai: HTTP 403
        "AgentAuthenticationError",  # Harbor: an installed agent's CLI could not log in
        "CallerCredentialAuthenticationError",  # litellm: the caller's own credential
    }
)
STOPS_AGENT_QUOTA = frozenset(
    {
        "PaymentRequiredError",  # litellm: HTTP 402
        "BudgetExceededError",  # litellm's own budget manager refused the call
    }
)
# By message, for types that also carry passing failures: OpenAI reports an empty
# account as a 429 (litellm: "RateLimitError: OpenAIException - You exceeded your
# current quota, please check your plan and billing details."; the code
# ``insufficient_quota`` stays in the body), Anthropic as a 400 about the credit
# balance. Gemini's per-minute limits say "exceeded your current quota" too, but point
# at its rate-limits page and say when to retry: those pass.
_QUOTA_MESSAGE = re.compile(
    r"insufficient_quota|exceeded your current quota|credit balance is too low"
    r"|payment required",
    re.IGNORECASE,
)
_PASSING_QUOTA = re.compile(r"rate-limits|retry in|per ?minute", re.IGNORECASE)


def stops_agent(exception_type: str | None, message: str | None) -> str | None:
    """Why this failure stops every trial of the agent ("authentication" or "quota").

    None for every other failure, rate limits and server errors included.
    """
    if not exception_type:
        return None
    if exception_type in STOPS_AGENT_AUTH:
        return "authentication"
    if exception_type in STOPS_AGENT_QUOTA:
        return "quota"
    provider = policy_for(exception_type).cause == FailureCause.MODEL_PROVIDER_FAILED
    if provider and message and _QUOTA_MESSAGE.search(message):
        return None if _PASSING_QUOTA.search(message) else "quota"
    return None
