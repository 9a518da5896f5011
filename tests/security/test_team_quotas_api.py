"""Team quotas at submit over the HTTP API (docs/scheduling.md).

The submitter app runs in process on the session's nats-server and ledger, with a
tokens file and a quotas file. Team red may submit 6 trials a day and run 2 at once;
team blue has no entry (and the file no default). A submission past red's day, or from
red once its spend reached the cap, is a 429 naming the quota, its limit and the use,
and publishes nothing; blue's identical submission is the negative control. The team
in the work messages is the token's, never the manifest's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import pytest

from schemas.subjects import Topology
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.quotas import QuotaConfigError
from services.submitter.app import create_app
from tests.security.http_api_support import api_as_users, random_tokens
from tests.support.servers import Servers
from tests.support.work_requests import work_messages

pytestmark = pytest.mark.integration

TOKENS = random_tokens(
    red={"user": "rita", "team": "red"},
    blue={"user": "bo", "team": "blue"},
)
QUOTAS = """\
teams:
  red: {max_concurrent_trials: 2, max_trials_per_day: 6, max_spend_usd_per_day: 10}
"""


def manifest(name: str, repetitions: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": ["hello-file"],
        "agents": [{"name": "oracle"}],
        "repetitions": repetitions,
        "compute": {"environment": "local"},
        **extra,
    }


async def test_a_team_past_its_quotas_is_refused_naming_the_quota(
    tmp_path: Path, servers: Servers, nats_url: str, topology: Topology
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS)
    async with api_as_users(servers, TOKENS, quotas_file=quotas) as (api, as_):
        first = await api.post("/experiments", json=manifest("r1"), headers=as_("red"))
        assert first.status_code == 202, first.text
        queued = await work_messages(nats_url, topology)
        assert len(queued) == 3
        assert {(m.team.name, m.team.max_concurrent_trials) for m in queued if m.team} == {
            ("red", 2)
        }
        assert all(m.team is not None for m in queued)

        # A resubmission of the queued experiment reserves its 3 trials (3 + 3 <= 6),
        # publishes only duplicates, and gives them back: still 3 used.
        again = await api.post("/experiments", json=manifest("r1"), headers=as_("red"))
        assert again.status_code == 202, again.text
        assert again.json()["n_duplicates"] == 3
        # 3 of 6 used: 4 more would pass the day's quota.
        refused = await api.post("/experiments", json=manifest("r2", 4), headers=as_("red"))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert "max_trials_per_day of team 'red': 3 of 6" in error, error
        assert "has 4 to run (3 left)" in error, error
        assert len(await work_messages(nats_url, topology)) == 3  # nothing published
        # Negative control: 3 fit exactly.
        fits = await api.post("/experiments", json=manifest("r3"), headers=as_("red"))
        assert fits.status_code == 202, fits.text
        assert len(await work_messages(nats_url, topology)) == 6

        # Negative control: team blue has no quota; its messages carry no team.
        blue = await api.post("/experiments", json=manifest("b1"), headers=as_("blue"))
        assert blue.status_code == 202, blue.text
        blues = [
            m for m in await work_messages(nats_url, topology) if m.experiment_id.startswith("b1")
        ]
        assert len(blues) == 3 and all(m.team is None for m in blues)

        # A manifest cannot name its team (nor its submitter): unknown fields.
        forged = await api.post(
            "/experiments", json=manifest("b2", team="red"), headers=as_("blue")
        )
        assert forged.status_code == 422, forged.text

        # Spend: once red's runners tallied its cap, red is refused, blue is not.
        nc = await nats.connect(nats_url)
        try:
            coord = await NatsCoordinator.open(nc.jetstream(), topology, lease_ttl_s=60.0)
            await coord.add_tally("spend", "red", 10.0)
        finally:
            await nc.close()
        refused = await api.post("/experiments", json=manifest("r4", 1), headers=as_("red"))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert "max_spend_usd_per_day of team 'red': $10.0000 of $10" in error, error
        blue = await api.post("/experiments", json=manifest("b3", 1), headers=as_("blue"))
        assert blue.status_code == 202, blue.text


async def test_a_bad_quotas_file_stops_the_start_naming_the_field(
    tmp_path: Path, servers: Servers
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("teams:\n  red: {max_trials_per_day: -1}\n")
    settings = servers.submitter_settings(api_no_auth=True, quotas_file=quotas)
    with pytest.raises(QuotaConfigError, match=r"teams\.red\.max_trials_per_day"):
        create_app(settings)
    # Negative control: the same file, corrected, builds the app.
    quotas.write_text(json.dumps({"teams": {"red": {"max_trials_per_day": 1}}}))
    create_app(settings)
