"""Team quotas while work runs, with real processes (docs/scheduling.md).

One stack each (real nats-server, ledger, importer, watcher, one runner process);
submissions with ``trialbus submit`` under ``TRIALBUS_CLI_TEAM`` and a quotas file.
Judged from the events stream and the ledger, never the clock.

- **Spend cap.** Every trial reports a cost of COST_USD (tests/support/priced_executor.py).
  Red's cap of CAP_USD is reached by its third trial: red starts no fourth while blue's
  experiment, submitted after it, runs to its end; `trialbus status` says
  `team_spend_capped`, `trialbus queue` gives red the reason `team_spend_cap` with its
  5 trials still queued, and none of red's trials failed. The operator raises the cap
  and runs `trialbus quotas`: red's held trials run, without resubmission, once each.
  Negative control: without the cap the same experiment runs to completion.
- **A lowered concurrency quota.** Red's work is queued (paused) while red may run 3 at
  once; the operator lowers it to 1 and runs `trialbus quotas`; resumed, the queued
  messages (which still carry 3) run one at a time. Negative control: the file is
  lowered but not published: 3 at once.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from infra.stack import EmbeddedStack
from schemas.events import TrialFailed
from schemas.subjects import Topology
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import experiment_id_of
from tests.e2e.conftest import Stacks
from tests.e2e.events import in_flight_counts, starts_of
from tests.e2e.faultkit import (
    Submitted,
    expected_trial_ids,
    instant_runner_env,
    judge,
    submit,
)
from tests.security.http_api_support import api_as_users, random_tokens
from tests.support.manifests import manifest_file, nop_agents, nop_manifest, quotas_file
from tests.support.priced_executor import EXECUTOR_SPEC as PRICED
from tests.support.servers import Servers

pytestmark = pytest.mark.e2e

COST_USD = 0.4
CAP_USD = 1.0
"""0.4, 0.8, 1.2: red's third trial reaches the cap, so exactly 3 start (one runner,
one trial of red at a time, and the runner reads its own tally write back)."""
N_RED, N_BLUE = 8, 10
TRIAL_S = 1.0
"""Blue's 10 trials one at a time: about 10 s, twice the longest hand-back delay (5 s),
so red's held trials were delivered and handed back meanwhile."""


TOKENS = random_tokens(
    red={"user": "rita", "team": "red"},
    blue={"user": "bo", "team": "blue"},
)


def stack_servers(stack: EmbeddedStack, folder: Path) -> Servers:
    """``stack``'s servers and names as a test's ``Servers`` (its own prefix and database)."""
    return Servers(
        stack.nats_url or "",
        stack.ledger_url or "",
        Topology(stack.prefix),
        stack.ledger_db,
        folder,
    )


async def http_submit(
    api: httpx.AsyncClient, headers: dict[str, str], folder: Path, name: str, reps: int
) -> Submitted:
    """Submit ``reps`` nop trials of the example task one at a time, as a token's team."""
    path = manifest_file(
        folder, name, tasks=["hello-file"], agents=nop_agents(1), repetitions=reps, concurrency=1
    )
    answer = await api.post(
        "/experiments",
        content=path.read_text(),
        headers={**headers, "Content-Type": "application/yaml"},
    )
    assert answer.status_code == 202, answer.text
    exp = answer.json()["experiment_id"]
    return Submitted(exp, expected_trial_ids(path, exp), reps)


@pytest.mark.parametrize("capped", [True, False], ids=["spend-cap", "control-no-cap"])
async def test_a_team_at_its_spend_cap_waits_visibly_and_loses_nothing(
    stacks: Stacks, tmp_path: Path, capped: bool
) -> None:
    red_cap = {"max_spend_usd_per_day": CAP_USD} if capped else {"max_trials_per_day": 1000}
    quotas = quotas_file(tmp_path, {"red": red_cap, "blue": {"max_spend_usd_per_day": 100}})
    env = instant_runner_env(
        TRIAL_S, TRIALBUS_EXECUTOR=PRICED, TRIALBUS_TEST_COST_USD=str(COST_USD)
    )
    stack = await stacks.start(concurrency=2, runner_env=env)
    tap = await stacks.tap(stack)
    red = stacks.cli(stack, TRIALBUS_CHECK_RUNNERS="false", TRIALBUS_QUOTAS_FILE=str(quotas))
    # Over HTTP with team tokens: the ledger records the team as the experiment's
    # submitter (`submitted_by`), which `status` and `queue` judge the cap by.
    async with api_as_users(stack_servers(stack, tmp_path), TOKENS, quotas_file=quotas) as (
        api,
        as_,
    ):
        red_sub = await http_submit(api, as_("red"), tmp_path, "red", N_RED)
        blue_sub = await http_submit(api, as_("blue"), tmp_path, "blue", N_BLUE)
    red_exp = red_sub.experiment_id
    # Blue, submitted after red, runs to its end whatever red's cap.
    await tap.all_imported(blue_sub.experiment_id, set(blue_sub.trial_ids), 180)
    if not capped:
        await tap.all_imported(red_exp, set(red_sub.trial_ids), 120)
        assert len(starts_of(tap.events, experiment_id=red_exp)) == N_RED
        said = await red.ajson("status", red_exp)
        assert "team_spend_capped" not in said, said
        check = await judge("no spend cap", stack, red_sub)
        assert check.ok and check.reruns == 0, check.explain()
        return

    # Capped: exactly the trials that reached the cap started; none failed.
    n_started = len(starts_of(tap.events, experiment_id=red_exp))
    assert n_started == 3, n_started
    failed = [e for e in tap.events if isinstance(e, TrialFailed) and e.experiment_id == red_exp]
    assert failed == [], failed
    assert len(tap.imported(red_exp)) == 3
    said = await red.ajson("status", red_exp)
    assert said.get("team_spend_capped") is True, said
    waits = await red.ajson("queue")
    (row,) = [e for e in waits["experiments"] if e["experiment_id"] == red_exp]
    assert (row["reason"], row["queued"], row["team"]) == ("team_spend_cap", N_RED - 3, "red"), row
    assert "$1.2000 of $1" in row["detail"], row
    # Blue's own cap is far: it never waited for spend (negative control of the reason).
    assert [e for e in waits["experiments"] if e["experiment_id"] == blue_sub.experiment_id] == []

    # The operator raises red's cap and publishes it: the held trials run, unsubmitted.
    quotas_file(tmp_path, {"red": {"max_spend_usd_per_day": 100}})
    published = await red.ajson("quotas")
    assert published["limits"]["teams"]["red"] == {"max_spend_usd_per_day": 100.0}, published
    await tap.all_imported(red_exp, set(red_sub.trial_ids), 120)
    starts = starts_of(tap.events, experiment_id=red_exp)
    assert sorted(s.trial_id for s in starts) == sorted(red_sub.trial_ids)  # each once
    assert {s.attempt for s in starts} == {1}
    for sub in (red_sub, blue_sub):
        check = await judge(f"spend cap: {sub.experiment_id}", stack, sub)
        assert check.ok and check.reruns == 0, check.explain()
    print(f"spend cap: red started {n_started} of {N_RED} while blue ran {N_BLUE}")


N_LOWERED = 6


@pytest.mark.parametrize("publish", [True, False], ids=["published", "control-not-published"])
async def test_a_lowered_concurrency_quota_reaches_queued_work(
    stacks: Stacks, tmp_path: Path, publish: bool
) -> None:
    quotas = quotas_file(tmp_path, {"red": {"max_concurrent_trials": 3}})
    stack = await stacks.start(concurrency=4, runner_env=instant_runner_env(TRIAL_S))
    tap = await stacks.tap(stack)
    red = stacks.cli(
        stack,
        TRIALBUS_CLI_TEAM="red",
        TRIALBUS_CHECK_RUNNERS="false",
        TRIALBUS_QUOTAS_FILE=str(quotas),
    )
    manifest = nop_manifest(tmp_path, "red-low", agents=1, repetitions=N_LOWERED, concurrency=1000)
    exp = experiment_id_of(load_manifest(manifest))
    # Queued first (paused), stamped with the quota of 3 at once.
    await red.ajson("pause", exp)
    sub = await submit(red, manifest)
    quotas_file(tmp_path, {"red": {"max_concurrent_trials": 1}})
    if publish:
        published = await red.ajson("quotas")
        assert published["limits"]["teams"]["red"] == {"max_concurrent_trials": 1}, published
    mark = tap.mark()
    await red.ajson("resume", exp)
    await tap.all_imported(exp, set(sub.trial_ids), 180)
    most = max(in_flight_counts(tap.since(mark), {exp}), default=0)
    print(f"lowered quota: published={publish} most_in_flight={most}")
    if publish:
        assert most == 1, most
    else:
        assert most > 1, most  # the messages' own 3 still apply
    assert {s.attempt for s in starts_of(tap.events, experiment_id=exp)} == {1}
    check = await judge("lowered quota", stack, sub)
    assert check.ok and check.reruns == 0, check.explain()
