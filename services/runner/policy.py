"""The runner's decision, as a pure function: what one attempt's outcome means.

Given the ``Attempt`` (the request, which start of its run, the host) and the
ExecutionOutcome, ``decide`` says which events the runner publishes (TrialCompleted, or
TrialFailed final or not) and how the work message is settled (ack, or nak with the
retry backoff). No I/O happens here: the handler publishes ``Decision.events`` in
order, then the consumer applies ``Decision.settle``. Harbor's error policy
(services.common.failures) decides which failures are worth another attempt; the
request's ``retry`` policy bounds how many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from schemas.events import TrialCompleted, TrialFailed, TrialRequested
from schemas.objects import ObjectRef
from schemas.record import FailureClass
from schemas.trial_events import MAX_MESSAGE_CHARS
from services.common.errors import ACK, InternalError, Settle, nak
from services.common.failures import classify, is_retryable, stops_agent
from services.common.fit import Lack
from services.common.ports import AttemptStart, ExecutionOutcome
from services.common.runner_policy import POLICY_REFUSED
from services.runner.preemption import ERROR_TYPE, Reason

# Not a Harbor exception: the executor's name for "Harbor finished without writing
# result.json". Another attempt may well produce one.
MISSING_RESULT = "MissingResult"


@dataclass(frozen=True, slots=True)
class Decision:
    """Events to publish (in this order), then the verdict on the work message."""

    events: tuple[TrialCompleted | TrialFailed, ...]
    settle: Settle

    @property
    def ending(self) -> TrialCompleted | TrialFailed | None:
        """The event that ends the run (TrialCompleted or a final TrialFailed), if any."""
        for event in self.events:
            if isinstance(event, TrialCompleted) or event.final:
                return event
        return None


class RunFields(TypedDict):
    """The fields by which every event a runner publishes about a run names that run."""

    experiment_id: str
    trial_id: str
    correlation_id: str
    run_id: str


def run_fields(request: TrialRequested) -> RunFields:
    """The run's names, as its work message gives them (``run_id`` keys the events'
    dedup ids: schemas.envelope.RunEvent)."""
    return RunFields(
        experiment_id=request.experiment_id,
        trial_id=request.trial_id,
        correlation_id=request.correlation_id,
        run_id=request.dedup_id(),
    )


@dataclass(frozen=True, slots=True)
class Attempt:
    """The attempt a runner's event reports: the run's work message, which start of the
    run it was (its number and the starts handed back before it) and the runner's host."""

    request: TrialRequested
    start: AttemptStart
    host: str

    def completed(self, result: ObjectRef, harbor_version: str) -> TrialCompleted:
        """The TrialCompleted of the attempt, pointing at its stored trial folder."""
        request = self.request
        return TrialCompleted(
            **run_fields(request),
            result=result,
            trial_name=request.trial_id,
            repetition=request.repetition,
            runner_host=self.host,
            harbor_version=harbor_version,
            environment=request.compute.environment,
            agent_label=request.agent.display,
            attempt=self.start.attempt,
            task=request.task,
        )

    def failed(
        self,
        outcome: ExecutionOutcome,
        *,
        final: bool,
        failure_class: FailureClass | None = None,
        result: ObjectRef | None = None,
    ) -> TrialFailed:
        """The TrialFailed of the attempt; the failure class follows Harbor's error policy
        unless ``failure_class`` names it. It names the starts of the run handed back
        before this one: its dedup id keeps them apart."""
        request = self.request
        failure = failure_class or classify(outcome.exception_type)
        return TrialFailed(
            **run_fields(request),
            # A failed attempt with no exception at all still failed: count it against
            # the infrastructure, never as an agent's or a verifier's result.
            failure_class="infrastructure" if failure == "none" else failure,
            error_type=(outcome.exception_type or "UnknownError")[:200],
            message=(outcome.message or "")[:MAX_MESSAGE_CHARS],
            attempt=self.start.attempt,
            final=final,
            result=result,
            task=request.task,
            agent=request.agent,
            repetition=request.repetition,
            runner_host=self.host,
            handed_back=self.start.handed_back,
        )

    @classmethod
    def first(cls, request: TrialRequested, host: str) -> Attempt:
        """The attempt of a trial refused before it starts: none was counted, so the first."""
        return cls(request, AttemptStart(1), host)


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff before attempt ``attempt + 1``: base, 2*base, 4*base... capped."""
    return float(min(max_s, base_s * (2 ** max(0, attempt - 1))))


def should_retry(request: TrialRequested, attempt: int, outcome: ExecutionOutcome) -> bool:
    """Whether another attempt is worth it and the retry policy still allows one."""
    if stops_agent(outcome.exception_type, outcome.message):
        return False  # a refused key or an empty account fails every attempt alike
    retryable = is_retryable(outcome.exception_type)
    if outcome.kind == "failed":
        retryable = retryable or outcome.exception_type == MISSING_RESULT
    return retryable and attempt < request.retry.max_attempts


def decide(
    attempt: Attempt,
    outcome: ExecutionOutcome,
    harbor_version: str,
    result: ObjectRef | None = None,
) -> Decision:
    """The events and the verdict for ``attempt``, which ended with ``outcome``.

    ``harbor_version``: the runner's Harbor, named by a TrialCompleted. ``result``: the
    stored trial folder of an attempt that ends the run (required for a completed one:
    TrialCompleted points at it).

    - retryable and attempts left: TrialFailed(final=False), nak after the backoff;
    - completed (Harbor wrote result.json): TrialCompleted, ack;
    - otherwise: TrialFailed(final=True), ack.
    """
    request, number = attempt.request, attempt.start.attempt
    if should_retry(request, number, outcome):
        retry = request.retry
        delay = backoff_delay(number, retry.backoff_seconds, retry.max_backoff_seconds)
        return Decision((attempt.failed(outcome, final=False),), nak(delay, "retry"))
    if outcome.kind == "completed":
        if result is None:
            raise InternalError(
                f"trial {request.trial_id} completed without its stored trial folder"
            )
        return Decision((attempt.completed(result, harbor_version),), ACK)
    return Decision((attempt.failed(outcome, final=True, result=result),), ACK)


def handed_back(attempt: Attempt, reason: Reason) -> Decision:
    """The runner stopped ``attempt`` to hand the trial back (services.runner.preemption):
    a non-final TrialFailed (class ``cancelled``: stopped by trialbus, never scored)
    naming the reason, then a nak with no delay so another slot runs it at once."""
    outcome = ExecutionOutcome(
        kind="failed",
        exception_type=ERROR_TYPE[reason],
        message=f"{reason}: {_HANDED_BACK_WHY[reason]} on {attempt.host}; the trial runs "
        "again from the start and this attempt is not counted",
    )
    event = attempt.failed(outcome, final=False, failure_class="cancelled")
    return Decision((event,), nak(0.0, "handback"))


_HANDED_BACK_WHY: dict[Reason, str] = {
    "preempted": "stopped for a waiting trial of a higher priority class",
    "stop_notice": "stopped by the runner's stop notice (it could not finish before the deadline)",
}


def cancelled(request: TrialRequested, attempt: int, host: str) -> Decision:
    """The experiment was cancelled (before or during this attempt): final, ack."""
    outcome = ExecutionOutcome(
        kind="failed", exception_type="CancelledError", message="experiment cancelled"
    )
    this = Attempt(request, AttemptStart(attempt), host)
    event = this.failed(outcome, final=True, failure_class="cancelled")
    return Decision((event,), ACK)


RUNNER_LACKS_CAPABILITY = "RunnerLacksCapability"


MISSING_SECRET = "MissingSecretError"
"""An agent's ``api_key_env`` variable no runner that could take the trial has (the
trial process raises it too: services.runner.trial_process)."""


def lacking(request: TrialRequested, host: str, lack: Lack, *, asked: bool) -> Decision:
    """This runner lacks what the trial needs (``lack``) and, when it ``asked`` the
    registry, no other live runner of the pool has it (final, ack):
    RunnerLacksCapability; PolicyRefused when its policy may not pass a key; else
    MissingSecretError (a key not set)."""
    pool = request.compute.pool
    missing = lack.describe(request)
    others = f", nor does any other live runner of pool {pool!r}" if asked else ""
    outcome = ExecutionOutcome(
        kind="failed",
        exception_type=_lacking_type(lack),
        message=f"runner on {host} (pool {pool!r}) {missing}{others}; start a runner of "
        "the pool that has it (environments, labels, the agent's keys, the task's "
        "variables), then resubmit",
    )
    return Decision((Attempt.first(request, host).failed(outcome, final=True),), ACK)


def _lacking_type(lack: Lack) -> str:
    if lack.capabilities:
        return RUNNER_LACKS_CAPABILITY
    return POLICY_REFUSED if lack.refused else MISSING_SECRET


AGENT_STOPPED = "AgentStopped"
BUDGET_EXCEEDED = "BudgetExceeded"


def refused(request: TrialRequested, host: str, error_type: str, message: str) -> Decision:
    """The trial ends before it starts (final, ack, unscored infrastructure): its agent
    was stopped (AGENT_STOPPED) or its experiment's budget is spent (BUDGET_EXCEEDED)."""
    outcome = ExecutionOutcome(kind="failed", exception_type=error_type, message=message)
    first = Attempt.first(request, host)
    event = first.failed(outcome, final=True, failure_class="infrastructure")
    return Decision((event,), ACK)
