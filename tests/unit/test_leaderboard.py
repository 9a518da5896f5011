"""Leaderboard and status arithmetic on hand-built TrialRecords."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from schemas.record import Evaluation, FailureClass, Provenance, RecordStatus, TrialRecord
from services.common.ledger import ExperimentInfo
from services.reports.leaderboard import LeaderboardRow, leaderboard, status_counts

_ids = itertools.count()


def scored(reward: float, agent: str = "oracle", **kw: Any) -> TrialRecord:
    return record(
        agent,
        Evaluation(
            rewards={"reward": reward},
            main_reward_key="reward",
            main_reward=reward,
            reward_valid=True,
        ),
        **kw,
    )


def unscored(cause: FailureClass, agent: str = "oracle", **kw: Any) -> TrialRecord:
    return record(
        agent,
        Evaluation(reward_valid=False, failure_class=cause, exception_type="SomeError"),
        status="partial" if cause == "infrastructure" else "complete",
        **kw,
    )


def record(
    agent: str,
    evaluation: Evaluation,
    *,
    model: str | None = None,
    label: str | None = None,
    status: RecordStatus = "complete",
) -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{next(_ids)}",
        experiment_id="exp",
        status=status,
        provenance=Provenance(task_name="task", agent_name=agent, agent_label=label, model=model),
        evaluation=evaluation,
    )


def info(n_trials: int, *agents: dict[str, Any]) -> ExperimentInfo:
    return ExperimentInfo(
        experiment_id="exp", name="demo", n_trials=n_trials, manifest={"agents": list(agents)}
    )


def row(rows: list[LeaderboardRow], agent: str, model: str | None = None) -> LeaderboardRow:
    [found] = [r for r in rows if r.agent == agent and r.model == model]
    return found


# -- leaderboard ---------------------------------------------------------------------------


def test_mean_and_pass_rate_are_exact() -> None:
    [r] = leaderboard([scored(1.0), scored(0.0), scored(0.5)])
    assert r.mean_reward == pytest.approx(0.5)
    assert r.pass_rate == pytest.approx(1 / 3)
    assert (r.n_trials, r.n_recorded, r.n_scored, r.n_passed, r.n_pending) == (3, 3, 3, 1, 0)
    assert r.unscored_by_cause == {}


def test_pass_needs_a_reward_of_at_least_one() -> None:
    [r] = leaderboard([scored(0.999), scored(1.0), scored(1.5)])
    assert r.n_passed == 2


def test_unscored_records_never_count_as_zeros() -> None:
    recs = [
        scored(1.0),
        scored(1.0),
        unscored("infrastructure"),
        unscored("verifier"),
        unscored("verifier"),
        unscored("cancelled"),
    ]
    [r] = leaderboard(recs)
    assert r.mean_reward == 1.0
    assert r.pass_rate == 1.0
    assert r.n_scored == 2
    assert r.n_recorded == 6
    assert r.unscored_by_cause == {"cancelled": 1, "infrastructure": 1, "verifier": 2}


def test_a_group_without_scored_trials_has_no_mean() -> None:
    rows = leaderboard([scored(0.25, "nop"), unscored("verifier", "broken")])
    broken = row(rows, "broken")
    assert broken.mean_reward is None
    assert broken.pass_rate is None
    assert broken.n_passed == 0
    assert broken.unscored_by_cause == {"verifier": 1}


def test_pending_comes_from_the_submitted_trial_count() -> None:
    # 2 tasks x 2 agents x 3 repetitions = 12 trials, 6 per agent.
    exp = info(12, {"name": "oracle"}, {"name": "nop"})
    rows = leaderboard([scored(1.0), scored(1.0), unscored("verifier"), scored(0.0, "nop")], exp)
    oracle, nop = row(rows, "oracle"), row(rows, "nop")
    assert (oracle.n_trials, oracle.n_recorded, oracle.n_pending) == (6, 3, 3)
    assert (nop.n_trials, nop.n_recorded, nop.n_pending) == (6, 1, 5)


def test_agents_without_any_record_still_get_a_row() -> None:
    exp = info(4, {"name": "oracle"}, {"import_path": "pkg.mod:Agent", "model": "m"})
    rows = leaderboard([scored(1.0)], exp)
    waiting = row(rows, "pkg.mod:Agent", "m")
    assert (waiting.n_trials, waiting.n_recorded, waiting.n_pending) == (2, 0, 2)
    assert waiting.mean_reward is None
    assert rows[-1] is waiting


def test_agents_sharing_a_label_and_model_share_one_row_and_its_expected_count() -> None:
    # Two configurations of one agent with the same (default) label: 1 task x 1 rep each.
    exp = info(2, {"name": "oracle", "kwargs": {"k": 1}}, {"name": "oracle", "kwargs": {"k": 2}})
    [r] = leaderboard([], exp)
    assert (r.n_trials, r.n_pending) == (2, 2)
    assert status_counts([], exp)["pending"] == r.n_pending


def test_more_records_than_expected_never_gives_negative_pending() -> None:
    [r] = leaderboard([scored(1.0)] * 3, info(2, {"name": "oracle"}))
    assert (r.n_trials, r.n_pending) == (3, 0)


def test_label_is_the_row_name_when_given() -> None:
    recs = [scored(1.0, "terminus-2", label="t2-fast"), scored(0.0, "terminus-2")]
    exp = info(
        4, {"name": "terminus-2", "label": "t2-fast", "kwargs": {"k": 1}}, {"name": "terminus-2"}
    )
    rows = leaderboard(recs, exp)
    assert [r.agent for r in rows] == ["t2-fast", "terminus-2"]
    assert row(rows, "t2-fast").n_pending == 1
    assert row(rows, "terminus-2").mean_reward == 0.0


def test_one_row_per_agent_and_model() -> None:
    recs = [
        scored(1.0, "terminus-2", model="model-a"),
        scored(0.0, "terminus-2", model="model-a"),
        scored(0.0, "terminus-2", model="model-b"),
        scored(1.0, "terminus-2"),
    ]
    rows = leaderboard(recs)
    assert [(r.agent, r.model, r.n_scored) for r in rows] == [
        ("terminus-2", None, 1),
        ("terminus-2", "model-a", 2),
        ("terminus-2", "model-b", 1),
    ]
    assert row(rows, "terminus-2", "model-a").mean_reward == 0.5


def test_rows_sort_by_mean_then_name_with_unscored_last() -> None:
    recs = [
        unscored("verifier", "aaa-unscored"),
        scored(0.5, "zeta"),
        scored(0.5, "alpha"),
        scored(0.0, "bottom"),
        scored(0.9, "top"),
    ]
    assert [r.agent for r in leaderboard(recs)] == [
        "top",
        "alpha",
        "zeta",
        "bottom",
        "aaa-unscored",
    ]


def test_no_records_and_no_info_is_an_empty_board() -> None:
    assert leaderboard([]) == []
    assert leaderboard([], info(0)) == []


def test_row_as_dict() -> None:
    [r] = leaderboard([scored(1.0), unscored("verifier")])
    assert r.as_dict() == {
        "agent": "oracle",
        "model": None,
        "n_trials": 2,
        "n_recorded": 2,
        "n_scored": 1,
        "n_pending": 0,
        "unscored_by_cause": {"verifier": 1},
        "mean_reward": 1.0,
        "pass_rate": 1.0,
        "n_passed": 1,
    }


# -- status_counts --------------------------------------------------------------------------


def test_status_counts_by_state_and_cause() -> None:
    recs = [
        scored(1.0),
        scored(0.0, "nop"),
        unscored("verifier"),
        unscored("verifier", "nop"),
        unscored("infrastructure"),
    ]
    assert status_counts(recs, info(8, {"name": "oracle"}, {"name": "nop"})) == {
        "total": 8,
        "recorded": 5,
        "pending": 3,
        "scored": 2,
        "unscored": 3,
        "complete": 4,
        "partial": 1,
        "unscored_infrastructure": 1,
        "unscored_verifier": 2,
    }


def test_status_counts_without_info_uses_the_records() -> None:
    counts = status_counts([scored(1.0), unscored("cancelled")], None)
    assert (counts["total"], counts["pending"], counts["unscored_cancelled"]) == (2, 0, 1)


def test_status_counts_agree_with_the_leaderboard() -> None:
    recs = [scored(1.0), scored(0.5, "nop"), unscored("verifier", "nop"), unscored("agent")]
    exp = info(6, {"name": "oracle"}, {"name": "nop"})
    rows, counts = leaderboard(recs, exp), status_counts(recs, exp)
    assert sum(r.n_scored for r in rows) == counts["scored"]
    assert sum(r.n_pending for r in rows) == counts["pending"]
    assert sum(sum(r.unscored_by_cause.values()) for r in rows) == counts["unscored"]
