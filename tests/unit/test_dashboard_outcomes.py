"""The experiment page's failure causes and pass@k (dashboard_charts.unscored_causes,
dashboard_charts.pass_at_k) from the report's JSON, and their fragments in the live
updates (dashboard_stream.sections): the JSON's numbers, changed when they change,
escaped."""

from __future__ import annotations

from typing import Any

from schemas.record import Evaluation, TrialRecord
from services.common.adapters.memory import InMemoryLedger
from services.common.ports import ExperimentInfo
from services.reports.report import build_report
from services.submitter import dashboard_charts as charts
from services.submitter.dashboard_stream import sections
from tests.support.records import report_record, single_reward

EVIL = "<script>alert(1)</script>"


def invalid_reward() -> Evaluation:
    """The verifier named a main reward the importer could not use (NaN, a string)."""
    return Evaluation(main_reward_key="reward", main_reward=None, reward_valid=False)


def records(passes_t2: int = 1, agent: str = "oracle") -> list[TrialRecord]:
    """``agent``: 2 attempts at each of t1 (both pass), t2 (``passes_t2`` pass), t3
    (none); 3 unscored (2 verifier, 1 invalid_reward). ``nop``: 1 infrastructure."""
    out = []
    for task, n_pass in (("t1", 2), ("t2", passes_t2), ("t3", 0)):
        for i in range(2):
            out.append(
                report_record(single_reward(1.0 if i < n_pass else 0.0), task=task, agent=agent)
            )
    out += [
        report_record(single_reward(None, "verifier", "VerifierTimeout"), task="t1", agent=agent),
        report_record(single_reward(None, "verifier", "VerifierTimeout"), task="t2", agent=agent),
        report_record(invalid_reward(), task="t3", agent=agent),
        report_record(single_reward(None, "infrastructure", "DockerError"), task="t1", agent="nop"),
    ]
    return out


def board(recs: list[TrialRecord]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = build_report("exp", recs, None)["leaderboard"]
    return rows


def test_unscored_causes_per_agent_are_the_leaderboard_s() -> None:
    rows = board(records())
    causes = charts.unscored_causes(rows)
    assert causes["causes"] == ["infrastructure", "invalid_reward", "verifier"]
    by_agent = {r["agent"]: r for r in causes["rows"]}
    assert by_agent["oracle"]["counts"] == [0, 1, 2]
    assert by_agent["nop"]["counts"] == [1, 0, 0]
    assert (by_agent["oracle"]["unscored"], by_agent["oracle"]["recorded"]) == (3, 9)
    for r in rows:  # the same counts as the leaderboard's JSON
        counts = dict(zip(causes["causes"], by_agent[str(r["agent"])]["counts"], strict=True))
        assert {c: n for c, n in counts.items() if n} == r["unscored_by_cause"]
    assert causes["any"]
    # Negative controls: one more verifier failure moves its count; none unscored, none listed.
    more = [*records(), report_record(single_reward(None, "verifier"), task="t3", agent="oracle")]
    again = {r["agent"]: r for r in charts.unscored_causes(board(more))["rows"]}
    assert again["oracle"]["counts"] == [0, 1, 3]
    clean = charts.unscored_causes(board(records()[:6]))
    assert clean["causes"] == [] and not clean["any"]


def test_pass_at_k_shows_the_report_s_values_and_its_ks() -> None:
    rows = board(records())
    passk = charts.pass_at_k(rows)
    assert passk["ks"] == [1, 2]
    by_agent = {r["agent"]: r for r in passk["rows"]}
    # t1 2/2, t2 1/2, t3 0/2: pass@1 = (1 + .5 + 0) / 3, pass@2 = (1 + 1 + 0) / 3.
    assert by_agent["oracle"]["values"] == ["0.500", "0.667"]
    assert by_agent["oracle"]["tasks"] == 3 and by_agent["oracle"]["note"] == ""
    oracle = next(r for r in rows if r["agent"] == "oracle")
    assert oracle["pass_at_k"] == {"1": 0.5, "2": 2 / 3}
    # nop has no scored trial: no value, and it says why.
    assert by_agent["nop"]["values"] == ["-", "-"]
    assert by_agent["nop"]["note"] == "no scored trial"
    # Negative control: a second pass at t2 changes pass@1 (t2 now 2/2), not pass@2.
    changed = {r["agent"]: r for r in charts.pass_at_k(board(records(passes_t2=2)))["rows"]}
    assert changed["oracle"]["values"] == ["0.667", "0.667"]


async def fragments(recs: list[TrialRecord]) -> dict[str, str]:
    ledger = InMemoryLedger()
    await ledger.upsert_experiment(ExperimentInfo("exp", "o", len(recs), {}))
    await ledger.upsert_records(recs)
    return (await sections(ledger, "exp", recs, {})).html()


async def test_the_fragments_carry_causes_and_pass_at_k_escaped() -> None:
    html = await fragments(records(agent=EVIL))
    causes, passk = html["causes"], html["passk"]
    assert "<script>" not in causes and "<script>" not in passk
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in causes
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in passk
    assert '<td class="num" data-label="verifier">2</td>' in causes
    assert '<td class="num" data-label="invalid_reward">1</td>' in causes
    assert "VerifierTimeout" in causes and "DockerError" in causes
    assert '<td class="num" data-label="pass@1">0.500</td>' in passk
    assert '<td class="num" data-label="pass@2">0.667</td>' in passk
    # Negative control: other records, other numbers in the fragments.
    other = await fragments(records(passes_t2=2, agent=EVIL)[:-2])
    assert '<td class="num" data-label="pass@1">0.667</td>' in other["passk"]
    assert '<td class="num" data-label="pass@1">0.500</td>' not in other["passk"]
    assert '<td class="num" data-label="invalid_reward">' not in other["causes"]


async def test_too_few_scored_trials_say_so_instead_of_a_pass_at_k() -> None:
    html = await fragments(records()[:4])
    assert "No pass@k yet: it needs at least 5 scored trials" in html["passk"]
    assert "Every recorded trial is scored." in html["causes"]
