"""The experiment page's failure causes and pass@k, and the compare page, read through
the in-process API on the real nats-server and ledger: their numbers are the JSON
endpoints' (``GET /experiments/{id}/report``, ``GET /compare``: what ``trialbus
report --json`` and ``trialbus compare --json`` print), an unknown side is a clear
404 page, and the experiment page links to the comparison."""

from __future__ import annotations

import html

import markupsafe
import pytest

from schemas.record import Evaluation, Provenance, TrialRecord
from services.common.ports import ExperimentInfo
from services.reports.formatting import num, with_ci
from tests.support.records import single_reward
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

EXP = "dash-outcomes"
EVIL_AGENT = "<script>alert('a')</script>"


def _record(i: int, task: str, agent: str, evaluation: Evaluation) -> TrialRecord:
    return TrialRecord(
        trial_id=f"{EXP}-{agent}-{i}".replace("<", "").replace(">", "").replace("'", ""),
        experiment_id=EXP,
        status="complete",
        provenance=Provenance(task_name=task, agent_name=agent),
        evaluation=evaluation,
    )


def _records() -> list[TrialRecord]:
    """oracle passes 6 tasks twice; the hostile agent passes t0 and t1 and fails the
    rest, with one verifier failure and one invalid reward."""
    out = []
    for t in range(6):
        for rep in range(2):
            i = 2 * t + rep
            out.append(_record(i, f"t{t}", "oracle", single_reward(1.0)))
            out.append(_record(i, f"t{t}", EVIL_AGENT, single_reward(1.0 if t < 2 else 0.0)))
    out.append(_record(90, "t0", EVIL_AGENT, single_reward(None, "verifier", "VerifierError")))
    invalid = Evaluation(main_reward_key="reward", main_reward=None, reward_valid=False)
    out.append(_record(91, "t1", EVIL_AGENT, invalid))
    return out


async def test_pages_show_the_json_endpoints_numbers(
    servers: Servers,
) -> None:
    ledger = servers.ledger()
    await ledger.ensure_indexes()
    records = _records()
    await ledger.upsert_experiment(ExperimentInfo(EXP, "outcomes", len(records), {}))
    await ledger.upsert_records(records)
    await ledger.close()
    async with servers.api(api_no_auth=True, check_runners=False) as web:
        report = (await web.get(f"/experiments/{EXP}/report")).json()
        page = (await web.get(f"/ui/experiments/{EXP}")).text
        rows = {r["agent"]: r for r in report["leaderboard"]}
        assert "<script>alert" not in page
        # Failure causes: the report's unscored_by_cause, per agent.
        evil = rows[EVIL_AGENT]
        assert evil["unscored_by_cause"] == {"invalid_reward": 1, "verifier": 1}
        for cause, n in evil["unscored_by_cause"].items():
            assert f'<td class="num" data-label="{cause}">{n}</td>' in page
        assert str(markupsafe.escape(EVIL_AGENT)) in page  # as the templates escape
        # pass@k: the report's values and ks (the hostile agent: 2 of 6 tasks passed).
        for row in rows.values():
            for k, value in row["pass_at_k"].items():
                assert f'data-label="pass@{k}">{num(value)}</td>' in page
        assert evil["pass_at_k"]["1"] == pytest.approx(2 / 6)
        assert 'data-label="pass@1">0.333</td>' in page

        # The compare page the experiment page links to, against GET /compare.
        link = html.unescape(page.split('<a href="/ui/compare?', 1)[1].split('"', 1)[0])
        params = dict(p.split("=", 1) for p in link.split("&"))
        assert params.keys() == {"a", "agent_a", "agent_b"}
        query = {"a": EXP, "agent_a": "oracle", "agent_b": EVIL_AGENT}
        cmp = (await web.get("/compare", params=query)).json()
        shown = await web.get("/ui/compare", params=query)
        assert shown.status_code == 200 and "<script>alert" not in shown.text
        d = cmp["mean_reward"]
        assert d["difference"] == pytest.approx(4 / 6)
        assert f'data-label="A - B [95% CI]">{with_ci(d["difference"], d["ci"])}</td>' in shown.text
        assert str(markupsafe.escape(cmp["verdict"])) in shown.text
        for t in cmp["per_task"]:
            diff = t["a"]["mean_reward"] - t["b"]["mean_reward"]
            assert f'<th scope="row">{t["task"]}</th>' in shown.text
            assert f'data-label="A - B">{diff:+.3f}</td>' in shown.text
        # Negative control: the same page for other sides shows other numbers.
        swapped = await web.get(
            "/ui/compare", params={**query, "agent_a": EVIL_AGENT, "agent_b": "oracle"}
        )
        assert with_ci(d["difference"], d["ci"]) not in swapped.text

        # An unknown side: a page that says so, not a 500; JSON agrees it is unknown.
        for bad, code in (({"a": "no-such-exp"}, 404), ({**query, "agent_b": "nobody"}, 422)):
            answer = await web.get("/ui/compare", params=bad)
            assert answer.status_code == code, answer.text
            assert 'id="compare-error"' in answer.text
            assert (await web.get("/compare", params=bad)).status_code == code
        assert (
            "no experiment &#39;no-such-exp&#39;"
            in (await web.get("/ui/compare", params={"a": "no-such-exp"})).text
        )
        # No side given: the form alone.
        assert 'name="agent_b"' in (await web.get("/ui/compare")).text
