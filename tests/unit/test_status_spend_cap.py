"""``team_spend_capped`` in ``experiment_status`` (services/reports/queries.py) through
``follow.spend_capped_of``: present only while trials wait and the experiment's team
reached its spend cap; under the cap, without a quotas file, or once every trial is
recorded, absent."""

from __future__ import annotations

from services.common.adapters.memory import InMemoryCoordinator, InMemoryLedger
from services.common.ports import ExperimentInfo
from services.common.quotas import Quotas, TeamQuota
from services.reports import queries
from services.submitter.follow import spend_capped_of
from tests.support.records import passed_record

QUOTAS = Quotas(teams={"red": TeamQuota(max_spend_usd_per_day=5)})


async def test_status_says_the_team_is_at_its_spend_cap_only_while_it_is() -> None:
    ledger = InMemoryLedger()
    manifest = {"submitted_by": {"user": "rita", "team": "red"}}
    await ledger.upsert_experiment(ExperimentInfo("exp", "p", 2, manifest))
    await ledger.upsert_records([passed_record(0)])
    coord = InMemoryCoordinator(lease_ttl_s=60)

    async def status(quotas: Quotas | None) -> dict[str, int | str | bool]:
        lookups = queries.Lookups(team_capped_of=spend_capped_of(coord, quotas))
        return await queries.experiment_status(ledger, "exp", lookups)

    await coord.add_tally("spend", "red", 4.99)
    assert "team_spend_capped" not in await status(QUOTAS)  # control: a cent under
    await coord.add_tally("spend", "red", 0.01)
    assert (await status(QUOTAS))["team_spend_capped"] is True
    assert "team_spend_capped" not in await status(None)  # no quotas file: never
    await ledger.upsert_records([passed_record(1)])
    assert "team_spend_capped" not in await status(QUOTAS)  # nothing waits any more
