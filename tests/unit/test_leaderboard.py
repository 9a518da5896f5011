"""Leaderboard and status arithmetic on hand-built TrialRecords."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.record import (
    Evaluation,
    FailureClass,
    RecordStatus,
    TrialRecord,
    Usage,
)
from services.common.ports import ExperimentInfo
from services.reports.leaderboard import MIN_SCORED, LeaderboardRow, leaderboard, status_counts
from tests.support.records import report_record


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
    return report_record(evaluation, agent=agent, model=model, label=label, status=status)


def info(n_trials: int, *agents: dict[str, Any]) -> ExperimentInfo:
    return ExperimentInfo(
        experiment_id="exp", name="demo", n_trials=n_trials, manifest={"agents": list(agents)}
    )


def row(rows: list[LeaderboardRow], agent: str, model: str | None = None) -> LeaderboardRow:
    [found] = [r for r in rows if r.agent == agent and r.model == model]
    return found


# -- leaderboard ---------------------------------------------------------------------------


def test_mean_and_pass_rate_are_exact() -> None:
    [r] = leaderboard([scored(1.0), scored(0.0), scored(0.5)], min_scored=1)
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
    [r] = leaderboard(recs, min_scored=1)
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
    rows = leaderboard(recs, exp, min_scored=1)
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
    rows = sorted(leaderboard(recs, min_scored=1), key=lambda r: r.model or "")
    assert [(r.agent, r.model, r.n_scored) for r in rows] == [
        ("terminus-2", None, 1),
        ("terminus-2", "model-a", 2),
        ("terminus-2", "model-b", 1),
    ]
    assert row(rows, "terminus-2", "model-a").mean_reward == 0.5


def test_rows_sort_by_lower_bound_then_name_with_unscored_last() -> None:
    recs = [
        unscored("verifier", "aaa-unscored"),
        scored(0.5, "zeta"),
        scored(0.5, "alpha"),
        scored(0.0, "bottom"),
        scored(0.9, "top"),
    ]
    assert [r.agent for r in leaderboard(recs, min_scored=1)] == [
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
    [r] = leaderboard([scored(1.0), unscored("verifier")], min_scored=1)
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
        "n_unscored": 1,
        "too_few": False,
        "min_scored": 1,
        "binary_rewards": True,
        "mean_reward_ci": [pytest.approx(0.2065, abs=1e-4), 1.0],
        "mean_reward_ci_method": "wilson",
        "pass_rate_ci": [pytest.approx(0.2065, abs=1e-4), 1.0],
        "pass_at_k": {"1": 1.0},
        "pass_at_k_tasks": 1,
        "main_reward_keys": ["reward"],
        "reward_keys": {
            "reward": {
                "n": 1,
                "value": 1.0,
                "ci": [pytest.approx(0.2065, abs=1e-4), 1.0],
                "ci_method": "wilson",
                "too_few": False,
            }
        },
        # Nothing reported: every figure is unknown for both trials, never 0.
        "usage": {
            name: {
                "n_recorded": 2,
                "n_reported": 0,
                "n_unknown": 2,
                "sum": None,
                "n_scored": 1,
                "n_scored_reported": 0,
                "mean_per_scored": None,
            }
            for name in ("n_input_tokens", "n_cache_tokens", "n_output_tokens", "cost_usd")
        },
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


# -- honest scores: too few, intervals, ranking, pass@k, keys, usage ---------------------------


def on_task(reward: float, task: str, agent: str = "oracle", **kw: Any) -> TrialRecord:
    rec = scored(reward, agent, **kw)
    return rec.model_copy(
        update={"provenance": rec.provenance.model_copy(update={"task_name": task})}
    )


def test_too_few_scored_trials_give_flagged_estimates_without_pass_at_k() -> None:
    [r] = leaderboard([scored(1.0)] * 4 + [unscored("infrastructure")])
    assert (r.n_scored, r.n_passed, r.too_few, r.min_scored) == (4, 4, True, MIN_SCORED)
    # Wilson at 4/4: the number is given, and its width says how little it means.
    assert r.mean_reward == r.pass_rate == 1.0
    assert r.pass_rate_ci == r.mean_reward_ci == [pytest.approx(0.5101, abs=1e-4), 1.0]
    assert r.pass_at_k == {}
    [five] = leaderboard([scored(1.0)] * 5)
    assert five.too_few is False and five.mean_reward == 1.0


def test_all_unscored_row_has_no_estimate() -> None:
    [r] = leaderboard([unscored("infrastructure"), unscored("verifier")], min_scored=0)
    assert (r.n_scored, r.n_unscored, r.mean_reward, r.mean_reward_ci) == (0, 2, None, None)
    assert r.unscored_by_cause == {"infrastructure": 1, "verifier": 1}


def test_binary_rewards_get_wilson_intervals_other_rewards_a_bootstrap() -> None:
    [binary] = leaderboard([scored(1.0)] * 9)
    assert binary.binary_rewards and binary.mean_reward_ci_method == "wilson"
    assert binary.mean_reward_ci == [pytest.approx(0.7009, abs=1e-4), 1.0]
    assert binary.pass_rate_ci == binary.mean_reward_ci
    [graded] = leaderboard([scored(v) for v in (0.2, 0.4, 0.6, 0.8, 1.0)])
    assert not graded.binary_rewards and graded.mean_reward_ci_method == "bootstrap"
    assert graded.mean_reward_ci is not None
    assert graded.mean_reward_ci[0] <= 0.6 <= graded.mean_reward_ci[1]


def test_rows_rank_by_the_lower_bound_not_the_point_estimate() -> None:
    # "lucky": 5/5 passes (Wilson low 0.566); "steady": 45/50 (0.90, low 0.786).
    recs = [scored(1.0, "lucky")] * 5
    recs += [scored(1.0, "steady")] * 45 + [scored(0.0, "steady")] * 5
    rows = leaderboard(recs)
    assert [r.agent for r in rows] == ["steady", "lucky"]
    assert rows[1].mean_reward == 1.0 > rows[0].mean_reward  # type: ignore[operator]


def test_pass_at_k_over_tasks_for_every_k() -> None:
    recs = [on_task(v, "a") for v in (1.0, 0.0, 0.0)] + [on_task(v, "b") for v in (0.0, 0.0, 0.0)]
    [r] = leaderboard([*recs, unscored("infrastructure")])
    assert r.pass_at_k_tasks == 2
    assert r.pass_at_k == {
        1: pytest.approx((1 / 3 + 0) / 2),
        2: pytest.approx((1 - 1 / 3 + 0) / 2),
        3: pytest.approx(0.5),
    }
    assert r.as_dict()["pass_at_k"] == {"1": r.pass_at_k[1], "2": r.pass_at_k[2], "3": 0.5}


def test_each_reward_key_is_reported_with_its_own_count() -> None:
    def multi(rewards: dict[str, float]) -> TrialRecord:
        return record(
            "oracle",
            Evaluation(
                rewards=rewards,
                main_reward_key="reward",
                main_reward=rewards["reward"],
                reward_valid=True,
            ),
        )

    recs = [multi({"reward": 1.0, "style": 0.5})] * 5 + [multi({"reward": 0.0})] * 2
    [r] = leaderboard(recs)
    assert r.main_reward_keys == ["reward"]
    assert r.reward_keys["reward"]["n"] == 7
    assert r.reward_keys["reward"]["value"] == pytest.approx(5 / 7)
    assert r.reward_keys["style"]["n"] == 5 and r.reward_keys["style"]["value"] == 0.5


def test_usage_sums_every_trial_and_averages_scored_ones() -> None:
    paid = [
        scored(1.0).model_copy(update={"usage": Usage(cost_usd=0.5, n_input_tokens=100)})
        for _ in range(2)
    ]
    failed = unscored("infrastructure").model_copy(update={"usage": Usage(cost_usd=0.25)})
    [r] = leaderboard([*paid, failed, scored(0.0)], min_scored=1)
    counts = {"n_recorded": 4, "n_scored": 3}
    assert r.usage["cost_usd"] == {
        **counts,
        **{"n_reported": 3, "n_unknown": 1, "sum": 1.25},
        **{"n_scored_reported": 2, "mean_per_scored": 0.5},
    }
    assert r.usage["n_input_tokens"] == {
        **counts,
        **{"n_reported": 2, "n_unknown": 2, "sum": 200},
        **{"n_scored_reported": 2, "mean_per_scored": 100},
    }
    assert r.usage["n_output_tokens"]["sum"] is None  # unknown, not 0
    assert r.usage["n_output_tokens"]["n_unknown"] == 4


@given(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=5, max_size=25),
    st.lists(st.sampled_from(["infrastructure", "verifier", "cancelled"]), max_size=10),
)
@settings(database=None, deadline=None, max_examples=40)
def test_unscored_trials_change_the_denominator_never_the_estimates(
    values: list[float], causes: list[FailureClass]
) -> None:
    [clean] = leaderboard([scored(v) for v in values])
    [mixed] = leaderboard([*(scored(v) for v in values), *(unscored(c) for c in causes)])
    assert mixed.n_trials == clean.n_trials + len(causes)
    assert sum(mixed.unscored_by_cause.values()) == len(causes)
    for name in ("mean_reward", "pass_rate", "mean_reward_ci", "pass_rate_ci", "pass_at_k"):
        assert getattr(mixed, name) == getattr(clean, name)
