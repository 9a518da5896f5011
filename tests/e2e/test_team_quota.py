"""Team quotas with real processes (docs/scheduling.md).

One stack (real nats-server, ledger, importer, watcher, two runner processes of
concurrency 4 with the instant executor, each trial taking TRIAL_S). Two experiments of
6 trials are submitted with ``trialbus submit`` as team red (``TRIALBUS_CLI_TEAM``), whose
quotas file allows 2 trials at once and 12 a day. Judged from the events stream's order,
never the clock: a trial's TrialStarted is published after it took its team slot, and
its ending before the slot is given back, so counting starts minus endings along the
stream bounds what ran at once. With the quota, never more than 2 of red's trials;
negative control, the same submissions without a team: more than 2. A third submission
past the day's 12 trials exits 2 naming the quota. The ledger check finds every trial
once, none re-run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.events import TrialStarted
from tests.e2e.conftest import Stacks
from tests.e2e.events import in_flight_counts
from tests.e2e.faultkit import instant_runner_env, judge, submit
from tests.support.manifests import nop_manifest

pytestmark = pytest.mark.e2e

TEAM_LIMIT = 2
N_TRIALS = 6
TRIAL_S = 0.3


@pytest.mark.parametrize("team", ["red", None], ids=["quota", "control-no-team"])
async def test_a_team_runs_at_most_its_quota_on_a_real_fleet(
    stacks: Stacks, tmp_path: Path, team: str | None
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        f"teams:\n  red: {{max_concurrent_trials: {TEAM_LIMIT}, max_trials_per_day: 12}}\n"
    )
    stack = await stacks.start(n_runners=2, concurrency=4, runner_env=instant_runner_env(TRIAL_S))
    tap = await stacks.tap(stack)
    env = {"TRIALBUS_CHECK_RUNNERS": "false", "TRIALBUS_QUOTAS_FILE": str(quotas)}
    if team is not None:
        env["TRIALBUS_CLI_TEAM"] = team
    cli = stacks.cli(stack, **env)
    subs = [
        await submit(
            cli, nop_manifest(tmp_path, name, agents=1, repetitions=N_TRIALS, concurrency=1000)
        )
        for name in ("red-a", "red-b")
    ]
    for sub in subs:
        await tap.all_imported(sub.experiment_id, set(sub.trial_ids), 180)
    most = max(in_flight_counts(tap.events, {s.experiment_id for s in subs}), default=0)
    print(f"team quota: team={team} limit={TEAM_LIMIT} most_in_flight={most}")
    if team is not None:
        assert most <= TEAM_LIMIT, most
        # The day's 12 are used: one more trial is refused, naming the quota.
        code, _out, err = await cli.arun(
            "submit", str(nop_manifest(tmp_path, "red-c", agents=1, repetitions=1, concurrency=1))
        )
        assert code == 2, err.decode()
        assert "max_trials_per_day of team 'red': 12 of 12" in err.decode(), err.decode()
    else:
        assert most > TEAM_LIMIT, most
    starts = [e for e in tap.events if isinstance(e, TrialStarted)]
    assert {s.attempt for s in starts} == {1}
    for sub in subs:
        check = await judge(f"team quota: {sub.experiment_id}", stack, sub)
        assert check.ok, check.explain()
        assert check.reruns == 0
