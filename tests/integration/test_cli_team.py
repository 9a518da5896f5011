"""The CLI's team is recorded as an API token's is, on the real nats-server and ledger.

``trialbus submit`` under ``TRIALBUS_CLI_TEAM=red`` (a quotas file capping red's
spend): the importer (its own process) records ``submitted_by: {team: red}`` in the
ledger, so once red's spend tally reaches its cap, ``trialbus queue --json`` gives the
experiment the reason ``team_spend_cap`` naming red, ``status`` says
``team_spend_capped`` and ``experiments`` shows the team. Negative control: the same
manifest submitted without the variable records no submitter and waits for
``priority`` only. A resubmission under another team keeps the recorded owner, whose
quota applies (refused at red's cap), as an admin token's resubmission does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.service_process import ServiceProcess
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import ExperimentInfo
from tests.support import importer_process
from tests.support.importer_process import until
from tests.support.live_runner import announce_live_runner
from tests.support.manifests import nop_manifest
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

importer = importer_process.importer
importer_env = importer_process.importer_env
RECORDED_S = 60.0
"""Bound on the importer recording an ExperimentSubmitted (usually well under a second)."""
CAP_USD = 5.0


async def recorded(
    servers: Servers, proc: ServiceProcess, experiment_id: str, version: str | None = None
) -> ExperimentInfo:
    """The ledger's copy of the experiment, once the importer wrote it (with ``version``:
    once it wrote it again, the content version moving past ``version``)."""
    ledger = servers.ledger()
    try:

        async def written() -> bool:
            info = await ledger.get_experiment(experiment_id)
            now = await ledger.experiment_version(experiment_id)
            return info is not None and now is not None and now != version

        await until(f"the ledger's record of {experiment_id}", written, proc, RECORDED_S)
        info = await ledger.get_experiment(experiment_id)
        assert info is not None
        return info
    finally:
        await ledger.close()


async def test_the_cli_team_is_recorded_and_shown_where_it_waits(
    servers: Servers, importer: ServiceProcess, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(f"teams:\n  red: {{max_spend_usd_per_day: {CAP_USD}}}\n")
    cli = servers.cli(TRIALBUS_CHECK_RUNNERS="false", TRIALBUS_QUOTAS_FILE=str(quotas))
    as_red = servers.cli(
        TRIALBUS_CHECK_RUNNERS="false", TRIALBUS_QUOTAS_FILE=str(quotas), TRIALBUS_CLI_TEAM="red"
    )
    teamed = nop_manifest(tmp_path, "cli-red", agents=1, repetitions=3, concurrency=1000)
    teamless = nop_manifest(tmp_path, "cli-none", agents=1, repetitions=2, concurrency=1000)
    red_exp = (await as_red.ajson("submit", str(teamed)))["experiment_id"]
    none_exp = (await cli.ajson("submit", str(teamless)))["experiment_id"]

    red_info = await recorded(servers, importer, red_exp)
    none_info = await recorded(servers, importer, none_exp)
    assert red_info.manifest["submitted_by"] == {"team": "red"}
    assert "submitted_by" not in none_info.manifest  # the control: no variable, nobody

    nc = await servers.connect()
    try:
        js = nc.jetstream()
        # A live runner of the pool, so what is not held by its team waits for `priority`.
        await announce_live_runner(js, servers.topology, concurrency=2)
        # Red's spend as runners tally it: at its cap (after submitting: at its cap red
        # could not have submitted).
        coordinator = await NatsCoordinator.open(js, servers.topology, lease_ttl_s=60.0)
        await coordinator.add_tally("spend", "red", CAP_USD)
    finally:
        await nc.close()

    waits = await cli.ajson("queue")
    rows: dict[str, dict[str, Any]] = {e["experiment_id"]: e for e in waits["experiments"]}
    red, none = rows[red_exp], rows[none_exp]
    assert (red["team"], red["reason"], red["queued"]) == ("red", "team_spend_cap", 3), red
    assert "team 'red'" in red["detail"] and "of $5" in red["detail"], red
    assert (none["team"], none["reason"], none["queued"]) == (None, "priority", 2), none
    groups = {(g["team"], tuple(sorted(g["by_reason"].items()))) for g in waits["groups"]}
    assert groups == {("red", (("team_spend_cap", 3),)), (None, (("priority", 2),))}, groups

    assert (await cli.ajson("status", red_exp)).get("team_spend_capped") is True
    assert "team_spend_capped" not in await cli.ajson("status", none_exp)
    listed = {r["experiment_id"]: r for r in await cli.ajson("experiments")}
    assert (listed[red_exp]["team"], listed[red_exp]["submitted_by"]) == ("red", "team red")
    assert (listed[none_exp]["team"], listed[none_exp]["submitted_by"]) == (None, "-")

    # Resubmitted under another team, the experiment stays red's, and red's quota
    # applies: at its spend cap the resubmission is refused naming red.
    as_blue = servers.cli(
        TRIALBUS_CHECK_RUNNERS="false", TRIALBUS_QUOTAS_FILE=str(quotas), TRIALBUS_CLI_TEAM="blue"
    )
    code, _, err = await as_blue.arun("submit", str(teamed), "--json")
    assert code == 2, err.decode()
    assert "team 'red'" in err.decode() and "max_spend_usd_per_day" in err.decode(), err
    # The control of that rule: the experiment with no recorded owner becomes blue's.
    ledger = servers.ledger()
    try:
        before = await ledger.experiment_version(none_exp)
    finally:
        await ledger.close()
    await as_blue.ajson("submit", str(teamless))
    again = await recorded(servers, importer, none_exp, before)
    assert again.manifest["submitted_by"] == {"team": "blue"}
    assert (await recorded(servers, importer, red_exp)).manifest["submitted_by"] == {"team": "red"}
