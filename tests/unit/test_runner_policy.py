"""The runner's pure decision: outcome + attempt + retry policy -> events and a verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.events import TrialCompleted, TrialFailed, TrialRequested
from schemas.objects import ObjectRef
from services.common.errors import ACK, InternalError, Settle
from services.common.ports import AttemptStart
from services.runner.policy import Attempt, Decision, backoff_delay, cancelled, decide
from tests.unit.runner_support import completed, failed, make_request

HARBOR = "0.25.0"
RETRYABLE = "EnvironmentStartTimeoutError"  # Harbor: sandbox failed, retry may help
NOT_RETRYABLE = "AgentTimeoutError"  # Harbor: the agent's own result, final


STORED = ObjectRef(bucket="RESULTS", name="exp-1/hello__0001/1.tar.gz", size=9, sha256="ab" * 32)


def at(request: TrialRequested, attempt: int = 1) -> Attempt:
    """Attempt ``attempt`` of ``request`` on host node-a."""
    return Attempt(request, AttemptStart(attempt), "node-a")


def only(decision: Decision) -> TrialCompleted | TrialFailed:
    assert len(decision.events) == 1, decision.events
    return decision.events[0]


def test_a_clean_completion_is_published_and_acked(tmp_path: Path) -> None:
    req = make_request()
    decision = decide(at(req), completed(tmp_path), HARBOR, STORED)
    event = only(decision)
    assert isinstance(event, TrialCompleted)
    assert decision.settle == ACK
    assert (event.trial_id, event.attempt, event.run_id) == (req.trial_id, 1, req.dedup_id())
    assert (event.runner_host, event.harbor_version) == ("node-a", "0.25.0")
    assert (event.result, event.trial_name, event.repetition) == (
        STORED,
        req.trial_id,
        req.repetition,
    )
    assert event.agent_label == req.agent.display


@pytest.mark.parametrize("outcome_kind", ["completed", "failed"])
def test_a_retryable_error_with_attempts_left_is_retried_after_the_backoff(
    tmp_path: Path, outcome_kind: str
) -> None:
    req = make_request(max_attempts=3, backoff_s=2.0)
    outcome = (
        completed(tmp_path, error=RETRYABLE) if outcome_kind == "completed" else failed(RETRYABLE)
    )
    first = decide(at(req), outcome, HARBOR)
    second = decide(at(req, 2), outcome, HARBOR)
    for decision, delay in ((first, 2.0), (second, 4.0)):
        event = only(decision)
        assert isinstance(event, TrialFailed)
        assert event.final is False
        assert event.failure_class == "infrastructure"
        assert decision.settle == Settle("nak", delay, "retry")
    # Negative control: the last allowed attempt is final and acknowledged.
    last = decide(at(req, 3), outcome, HARBOR, STORED)
    assert last.settle == ACK
    if outcome_kind == "completed":
        # Harbor wrote a result (recording the error): it is what gets imported.
        assert isinstance(only(last), TrialCompleted)
    else:
        event = only(last)
        assert isinstance(event, TrialFailed) and event.final is True


def test_a_missing_result_is_retried_like_an_infrastructure_error() -> None:
    req = make_request(max_attempts=2)
    decision = decide(at(req), failed("MissingResult"), HARBOR)
    assert decision.settle.action == "nak"
    assert decide(at(req, 2), failed("MissingResult"), HARBOR).settle == ACK


def test_a_non_retryable_error_is_final_at_once(tmp_path: Path) -> None:
    req = make_request(max_attempts=5)
    failure = decide(at(req), failed(NOT_RETRYABLE), HARBOR)
    event = only(failure)
    assert isinstance(event, TrialFailed)
    assert event.final is True and event.failure_class == "agent"
    assert failure.settle == ACK
    # A completed trial whose agent timed out is a result, not a retry.
    result = decide(at(req), completed(tmp_path, error=NOT_RETRYABLE), HARBOR, STORED)
    assert isinstance(only(result), TrialCompleted)
    assert result.settle == ACK


def test_a_failure_without_an_exception_counts_against_the_infrastructure() -> None:
    event = only(decide(at(make_request()), failed(None), HARBOR))
    assert isinstance(event, TrialFailed)
    assert (event.failure_class, event.error_type, event.final) == (
        "infrastructure",
        "UnknownError",
        True,
    )


def test_each_attempt_has_its_own_dedup_id(tmp_path: Path) -> None:
    req = make_request(max_attempts=3)
    ids = {only(decide(at(req, n), failed(RETRYABLE), HARBOR)).dedup_id() for n in (1, 2, 3)}
    assert len(ids) == 3
    # Negative control: the same attempt decided twice (a redelivered report) dedups.
    again = only(decide(at(req, 2), failed(RETRYABLE), HARBOR)).dedup_id()
    assert again in ids


def test_a_completion_without_its_stored_folder_is_a_bug_not_a_result(tmp_path: Path) -> None:
    with pytest.raises(InternalError, match="without its stored trial folder"):
        decide(at(make_request()), completed(tmp_path), HARBOR)
    # Negative control: with the folder stored, the same outcome is a result.
    assert isinstance(
        only(decide(at(make_request()), completed(tmp_path), HARBOR, STORED)), TrialCompleted
    )


def test_a_final_failure_carries_the_stored_folder_when_there_is_one() -> None:
    event = only(decide(at(make_request()), failed(NOT_RETRYABLE), HARBOR, STORED))
    assert isinstance(event, TrialFailed) and event.result == STORED


def test_a_cancelled_trial_is_final_and_acked() -> None:
    req = make_request()
    decision = cancelled(req, 2, "node-a")
    event = only(decision)
    assert isinstance(event, TrialFailed)
    assert (event.failure_class, event.error_type, event.final) == (
        "cancelled",
        "CancelledError",
        True,
    )
    assert (event.attempt, event.result, event.runner_host) == (2, None, "node-a")
    assert decision.settle == ACK


@pytest.mark.parametrize(
    ("attempt", "expected"), [(0, 2.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (20, 10.0)]
)
def test_backoff_doubles_and_is_capped(attempt: int, expected: float) -> None:
    assert backoff_delay(attempt, 2.0, 10.0) == expected


def test_a_zero_backoff_hands_back_without_delay(tmp_path: Path) -> None:
    decision = decide(at(make_request(backoff_s=0.0)), failed(RETRYABLE), HARBOR)
    assert decision.settle == Settle("nak", 0.0, "retry")


def test_a_start_after_a_hand_back_names_it_and_dedups_apart() -> None:
    req = make_request()
    after = Attempt(req, AttemptStart(1, handed_back=1), "node-a")
    event = only(decide(after, failed(NOT_RETRYABLE), HARBOR))
    assert isinstance(event, TrialFailed) and event.handed_back == 1
    # Negative control: the same attempt with no start handed back before it.
    plain = only(decide(at(req), failed(NOT_RETRYABLE), HARBOR))
    assert isinstance(plain, TrialFailed) and plain.handed_back == 0
    assert event.dedup_id() != plain.dedup_id()
