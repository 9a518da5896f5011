"""Team quotas at ``trialbus submit`` (the CLI), on the real nats-server and ledger.

The CLI has no API token: its team is the operator's ``TRIALBUS_CLI_TEAM``. With it
set, a submission past the team's trials-per-day quota exits 2 naming the quota, its
limit and the use, and publishes nothing; unset (the negative control), the same
submission has no team and no quota and is queued.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.cli import run_module
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MANIFEST = str(REPO / "examples" / "experiment.yaml")  # 24 trials


async def test_the_cli_team_is_held_to_its_quota(servers: Servers, tmp_path: Path) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("teams:\n  ci: {max_trials_per_day: 10}\n")
    env = {
        **servers.cli().env,
        "TRIALBUS_CHECK_RUNNERS": "false",
        "TRIALBUS_QUOTAS_FILE": str(quotas),
    }
    refused = await asyncio.to_thread(
        run_module, {**env, "TRIALBUS_CLI_TEAM": "ci"}, "submit", MANIFEST, "--json"
    )
    assert refused.returncode == 2, refused.stderr
    assert "max_trials_per_day of team 'ci': 0 of 10" in refused.stderr, refused.stderr
    assert "has 24 to run" in refused.stderr
    # Negative control: no CLI team, no quota.
    queued = await asyncio.to_thread(run_module, env, "submit", MANIFEST, "--json")
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout)["n_published"] == 24
    # A bad quotas file is refused before anything connects, naming the field.
    quotas.write_text("teams:\n  ci: {max_trials_per_day: 10, max_trails: 1}\n")
    bad = await asyncio.to_thread(run_module, env, "submit", MANIFEST, "--json")
    assert bad.returncode == 2, bad.stderr
    assert "teams.ci.max_trails: unknown field" in bad.stderr, bad.stderr


async def test_a_cli_without_the_quotas_file_is_held_to_the_stack_s_quotas(
    servers: Servers, tmp_path: Path
) -> None:
    # The stack's submitter publishes its quotas file's limits when it starts; `trialbus
    # quotas` publishes them the same way. A CLI user of the stack sets only their team.
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("teams:\n  ci: {max_trials_per_day: 10}\n")
    env = {**servers.cli().env, "TRIALBUS_CHECK_RUNNERS": "false"}
    published = await asyncio.to_thread(
        run_module, {**env, "TRIALBUS_QUOTAS_FILE": str(quotas)}, "quotas", "--json"
    )
    assert published.returncode == 0, published.stderr
    team = {**env, "TRIALBUS_CLI_TEAM": "ci"}
    refused = await asyncio.to_thread(run_module, team, "submit", MANIFEST, "--json")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "max_trials_per_day of team 'ci': 0 of 10" in refused.stderr, refused.stderr
    # Control: another team has no quota in the published limits; it is queued.
    queued = await asyncio.to_thread(
        run_module, {**env, "TRIALBUS_CLI_TEAM": "other"}, "submit", MANIFEST, "--json"
    )
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout)["n_published"] == 24
