"""Paired comparisons (services.reports.compare) on hand-built records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.record import FailureClass, TrialRecord
from services.common.errors import UserInputError
from services.reports.compare import Side, compare, pick_side
from tests.support.records import report_record, single_reward

A, B = Side("exp-a", "alpha", None), Side("exp-b", "beta", None)


def trial(
    task: str,
    reward: float | None,
    agent: str = "alpha",
    model: str | None = None,
    cause: FailureClass = "none",
) -> TrialRecord:
    evaluation = single_reward(reward, "infrastructure" if reward is None else cause)
    return report_record(evaluation, task=task, agent=agent, model=model)


def side(outcomes: dict[str, list[float | None]], agent: str = "alpha") -> list[TrialRecord]:
    return [trial(t, r, agent) for t, rs in outcomes.items() for r in rs]


def test_a_clear_winner_on_single_attempts() -> None:
    a = side({f"t{i}": [1.0] for i in range(6)})
    b = side({f"t{i}": [1.0 if i < 2 else 0.0] for i in range(6)}, "beta")
    c = compare(A, a, B, b)
    assert (c.n_paired_tasks, c.too_few, c.binary_rewards) == (6, False, True)
    assert c.mean_reward is not None and c.mean_reward.difference == pytest.approx(4 / 6)
    assert c.pass_rate is not None and c.pass_rate.difference == pytest.approx(4 / 6)
    assert c.mean_reward.ci is not None and c.mean_reward.ci[0] > 0
    assert c.solved_only_by_a == ["t2", "t3", "t4", "t5"] and c.solved_only_by_b == []
    # McNemar: 4 discordant pairs all favour A: p = 2 * (1/2)^4 = 0.125.
    assert c.mcnemar == {"only_a": 4, "only_b": 0, "p_value": 0.125}
    assert c.verdict.startswith("alpha @ exp-a scores higher than beta @ exp-b")
    assert "McNemar exact p = 0.125" in c.verdict


def test_identical_sides_show_no_detectable_difference() -> None:
    outcomes: dict[str, list[float | None]] = {f"t{i}": [float(i % 2)] for i in range(8)}
    c = compare(A, side(outcomes), B, side(outcomes, "beta"))
    assert c.mean_reward is not None and c.mean_reward.difference == 0.0
    assert c.mean_reward.ci == [0.0, 0.0]
    assert c.verdict.startswith("no detectable difference")
    assert c.mcnemar == {"only_a": 0, "only_b": 0, "p_value": 1.0}


def test_only_tasks_both_sides_scored_are_compared() -> None:
    a = side({"t1": [1.0], "t2": [None], "t3": [1.0]})
    b = side({"t1": [0.0], "t2": [1.0], "t3": [None, 0.0], "t4": [1.0]}, "beta")
    c = compare(A, a, B, b, min_paired=1)
    assert c.n_paired_tasks == 2  # t1 and t3 (t3's unscored attempt is ignored)
    assert c.tasks_only_a_scored == [] and c.tasks_only_b_scored == ["t2", "t4"]
    assert c.mean_reward is not None and c.mean_reward.difference == 1.0


def test_too_few_paired_tasks_give_counts_and_the_exact_test_only() -> None:
    a = side({"t1": [1.0], "t2": [1.0], "t3": [1.0]})
    b = side({"t1": [0.0], "t2": [0.0], "t3": [0.0]}, "beta")
    c = compare(A, a, B, b)
    assert c.too_few and c.mean_reward is not None
    assert (c.mean_reward.a, c.mean_reward.b) == (1.0, 0.0)
    assert c.mean_reward.difference is None and c.mean_reward.ci is None
    assert c.mcnemar is not None and c.mcnemar["p_value"] == 0.25
    assert c.verdict.startswith("too few tasks scored by both sides (3 < 5)")


def test_nothing_in_common() -> None:
    c = compare(A, side({"t1": [1.0]}), B, side({"t2": [1.0]}, "beta"))
    assert c.n_paired_tasks == 0 and c.mean_reward is None and c.mcnemar is None
    assert c.verdict == "no task was scored by both sides: nothing to compare"


def test_solved_means_a_strict_majority_of_scored_attempts() -> None:
    a = side({"t1": [1.0, 1.0, 0.0], "t2": [1.0, 0.0]})
    b = side({"t1": [1.0, 0.0, 0.0], "t2": [0.0, 0.0]}, "beta")
    c = compare(A, a, B, b, min_paired=1)
    assert c.solved_only_by_a == ["t1"]  # t2: 1 of 2 is not a majority
    assert c.pass_rate is not None
    assert c.pass_rate.difference == pytest.approx(((2 / 3 - 1 / 3) + (1 / 2 - 0)) / 2)


def test_graded_rewards_have_no_mcnemar_test() -> None:
    a = side({f"t{i}": [0.5] for i in range(5)})
    b = side({f"t{i}": [0.25] for i in range(5)}, "beta")
    c = compare(A, a, B, b)
    assert c.binary_rewards is False and c.mcnemar is None
    assert c.mean_reward is not None and c.mean_reward.difference == 0.25


task_outcomes = st.dictionaries(
    st.sampled_from([f"t{i}" for i in range(10)]),
    st.lists(st.sampled_from([0.0, 1.0, None]), min_size=1, max_size=3),
    max_size=10,
)


@given(task_outcomes, task_outcomes)
@settings(database=None, deadline=None, max_examples=60)
def test_comparison_is_antisymmetric(
    a_out: dict[str, list[float | None]], b_out: dict[str, list[float | None]]
) -> None:
    a, b = side(a_out), side(b_out, "beta")
    ab, ba = compare(A, a, B, b, min_paired=1), compare(B, b, A, a, min_paired=1)
    assert ab.n_paired_tasks == ba.n_paired_tasks
    assert (ab.solved_only_by_a, ab.solved_only_by_b) == (ba.solved_only_by_b, ba.solved_only_by_a)
    if ab.mean_reward is None or ba.mean_reward is None:
        assert ab.mean_reward is ba.mean_reward is None
        return
    assert ab.mean_reward.difference == -ba.mean_reward.difference  # type: ignore[operator]
    assert ab.mean_reward.ci is not None and ba.mean_reward.ci is not None
    assert ab.mean_reward.ci == [-ba.mean_reward.ci[1], -ba.mean_reward.ci[0]]
    if ab.mcnemar is not None and ba.mcnemar is not None:
        assert ab.mcnemar["p_value"] == ba.mcnemar["p_value"]
        assert ab.mcnemar["only_a"] == ba.mcnemar["only_b"]


def test_pick_side_by_agent_and_model() -> None:
    recs = [trial("t", 1.0, "oracle"), trial("t", 1.0, "t2", "m1"), trial("t", 1.0, "t2", "m2")]
    assert pick_side("e", recs, "oracle") == Side("e", "oracle", None)
    assert pick_side("e", recs, "t2@m2") == Side("e", "t2", "m2")
    with pytest.raises(UserInputError, match=r"several agents \(oracle, t2@m1, t2@m2\)"):
        pick_side("e", recs, "t2")
    with pytest.raises(UserInputError, match="several agents"):
        pick_side("e", recs, None)
    with pytest.raises(UserInputError, match="has no agent 'nope'"):
        pick_side("e", recs, "nope")
    assert pick_side("e", recs[:1], None) == Side("e", "oracle", None)
