"""What waits and why, one read path: ``GET /queue``, ``trialbus queue --json`` and the
dashboard's ``/ui/queue`` agree, on the real nats-server and ledger.

Two teams submit over the HTTP API in three classes and two pools; one experiment is
paused, one holds its only concurrency slot (a lease, as a runner takes it), one is in
a pool with no live runner, the rest wait their turn; team red has spent its
``max_spend_usd_per_day`` (the quotas file, and the spend tally runners write), so
its unpaused experiment waits for the cap, while blue, under the same cap (the
control), shows its other reasons. Each reason shows, with the counts the work
stream holds. Negative control: once a consumer has taken and
acknowledged every work message (and the lease is given back), every view says
nothing waits. The experiments list (``experiments --json`` and the dashboard) shows
each experiment's class (the default one when unset) and team.
"""

from __future__ import annotations

import asyncio
import html as html_text
import json
import re
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from schemas.events import ExperimentSubmitted, parse_event
from schemas.subjects import Topology
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import ExperimentInfo
from services.submitter.http_security import SESSION_COOKIE
from tests.e2e.cli import run_module
from tests.security.http_api_support import api_as_users, random_tokens
from tests.support.live_runner import announce_live_runner
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKENS = random_tokens(
    red={"user": "rita", "team": "red", "priority_classes": ["urgent", "normal"]},
    blue={"user": "bo", "team": "blue"},
)


def manifest(name: str, reps: int, **compute: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": ["hello-file"],
        "agents": [{"name": "oracle"}],
        "repetitions": reps,
        "compute": {"environment": "local", **compute},
    }


SUBMISSIONS: dict[str, tuple[str, int, dict[str, Any]]] = {
    # name: (who, repetitions, compute)
    "red-urgent": ("red", 3, {"priority_class": "urgent"}),
    "red-paused": ("red", 2, {}),
    "blue-batch": ("blue", 4, {"priority_class": "batch", "n_concurrent_trials": 1}),
    "blue-gpu": ("blue", 2, {"pool": "gpu"}),
    "blue-normal": ("blue", 1, {}),
}
EXPECTED = {
    # name: (pool, class, team, queued, running, reason)
    "red-urgent": ("default", "urgent", "red", 3, 0, "team_spend_cap"),
    "red-paused": ("default", "normal", "red", 2, 0, "paused"),
    "blue-batch": ("default", "batch", "blue", 3, 1, "concurrency_limit"),
    "blue-gpu": ("gpu", "normal", "blue", 2, 0, "no_runner"),
    "blue-normal": ("default", "normal", "blue", 1, 0, "priority"),
}
QUOTAS = "teams:\n  red: {max_spend_usd_per_day: 5}\n  blue: {max_spend_usd_per_day: 5}\n"


def cells(html: str, row_attr: str) -> dict[str, dict[str, str]]:
    """Each ``<tr data-<row_attr>>``'s ``data-field`` cells, as text (tags stripped)."""
    rows: dict[str, dict[str, str]] = {}
    pattern = rf'<tr data-{row_attr}="([^"]+)"[^>]*>(.*?)</tr>'
    for key, body in re.findall(pattern, html, re.S):
        found = re.findall(r'data-field="([a-z_]+)"[^>]*>(.*?)</td>', body, re.S)
        rows[key] = {k: html_text.unescape(re.sub(r"<[^>]+>", "", v)).strip() for k, v in found}
    return rows


async def record_submissions(nc: Any, topology: Topology, ledger: MongoLedger) -> None:
    """Write each ExperimentSubmitted into the ledger as the importer does (no importer
    runs here: the queue reads the ledger's copy of each manifest)."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(topology.event_filter("experiment_submitted"), durable=None)
    msgs = await sub.fetch(len(SUBMISSIONS), timeout=30)
    for msg in msgs:
        event = parse_event(msg.data)
        assert isinstance(event, ExperimentSubmitted)
        await ledger.upsert_experiment(
            ExperimentInfo(event.experiment_id, event.name, event.n_trials, event.manifest)
        )
    await sub.unsubscribe()


async def test_queue_shows_what_waits_and_why_in_every_view(
    tmp_path: Path, servers: Servers, topology: Topology
) -> None:
    nc = await servers.connect()
    js = nc.jetstream()
    ledger = servers.ledger()
    coordinator = await NatsCoordinator.open(js, topology, lease_ttl_s=60.0)
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS)
    cli = servers.cli(TRIALBUS_QUOTAS_FILE=str(quotas))
    try:
        async with api_as_users(servers, TOKENS, quotas_file=quotas) as (api, as_):
            ids: dict[str, str] = {}
            for name, (who, reps, compute) in SUBMISSIONS.items():
                answer = await api.post(
                    "/experiments", json=manifest(name, reps, **compute), headers=as_(who)
                )
                assert answer.status_code == 202, answer.text
                ids[name] = answer.json()["experiment_id"]
            names = {exp: name for name, exp in ids.items()}
            # Guarded as every JSON endpoint: no token, no queue (control: with one, below).
            assert (await api.get("/queue")).status_code == 401
            assert (await api.get("/ui/queue")).headers["location"] == "/ui/login"
            api.cookies.set(SESSION_COOKIE, TOKENS["blue"][0])  # the dashboard's login
            await record_submissions(nc, topology, ledger)
            # One live runner in the default pool, none in gpu; red-paused paused; one
            # trial of blue-batch running (its only slot held, as a runner holds it).
            await announce_live_runner(js, topology, concurrency=2)
            paused = await api.post(f"/experiments/{ids['red-paused']}/pause", headers=as_("red"))
            assert paused.status_code == 200, paused.text
            lease = await coordinator.acquire(ids["blue-batch"], 1, "r-1")
            assert lease is not None
            # Spend as runners tally it (after submitting: at its cap red could not):
            # red at its cap, blue a cent under the same cap (the control).
            await coordinator.add_tally("spend", "red", 5.0)
            await coordinator.add_tally("spend", "blue", 4.99)

            async def views() -> tuple[dict[str, Any], dict[str, Any], str]:
                http = await api.get("/queue", headers=as_("blue"))
                assert http.status_code == 200, http.text
                done = await asyncio.to_thread(run_module, cli.env, "queue", "--json")
                assert done.returncode == 0, done.stderr
                page = await api.get(
                    "/ui/queue",
                )
                assert page.status_code == 200, page.text
                return http.json(), json.loads(done.stdout), page.text

            http, cli_view, html = await views()
            assert http == cli_view  # one read path
            shown = {
                names[e["experiment_id"]]: (
                    e["pool"],
                    e["priority_class"],
                    e["team"],
                    e["queued"],
                    e["running"],
                    e["reason"],
                )
                for e in http["experiments"]
            }
            assert shown == EXPECTED
            assert http["queued"] == 11
            assert "pool 'gpu'" in next(
                e["detail"] for e in http["experiments"] if e["reason"] == "no_runner"
            )
            capped = next(
                e["detail"] for e in http["experiments"] if e["reason"] == "team_spend_cap"
            )
            assert "team 'red'" in capped and "$5.0000 of $5" in capped
            # Status says it too (`team_spend_capped`); blue under its cap: absent.
            for name, capped_now in (("red-urgent", True), ("blue-normal", False)):
                got = await api.get(f"/experiments/{ids[name]}/status", headers=as_("blue"))
                assert got.status_code == 200, got.text
                said = await asyncio.to_thread(run_module, cli.env, "status", ids[name], "--json")
                assert said.returncode == 0, said.stderr
                for shown_status in (got.json(), json.loads(said.stdout)):
                    assert shown_status.get("team_spend_capped", False) is capped_now, name
            groups = {(g["pool"], g["priority_class"], g["team"]): g for g in http["groups"]}
            assert set(groups) == {(p, c, t) for p, c, t, *_ in EXPECTED.values()}
            assert groups[("default", "batch", "blue")]["by_reason"] == {"concurrency_limit": 3}
            page = cells(html, "experiment")
            assert {names[k]: v for k, v in page.items()} == {
                name: {
                    "pool": p,
                    "priority_class": c,
                    "team": t,
                    "queued": str(q),
                    "running": str(r),
                    "reason": reason,
                    "detail": next(
                        e["detail"]
                        for e in http["experiments"]
                        if names[e["experiment_id"]] == name
                    ),
                }
                for name, (p, c, t, q, r, reason) in EXPECTED.items()
            }
            group_cells = cells(html, "group")
            assert {k: v["queued"] for k, v in group_cells.items()} == {
                f"{p}/{c}/{t}": str(g["queued"]) for (p, c, t), g in groups.items()
            }

            # The experiments list: class (the default when unset) and team.
            listed = await asyncio.to_thread(run_module, cli.env, "experiments", "--json")
            assert listed.returncode == 0, listed.stderr
            rows = {names[r["experiment_id"]]: r for r in json.loads(listed.stdout)}
            assert {n: (r["priority_class"], r["team"]) for n, r in rows.items()} == {
                "red-urgent": ("urgent", "red"),
                "red-paused": (None, "red"),
                "blue-batch": ("batch", "blue"),
                "blue-gpu": (None, "blue"),
                "blue-normal": (None, "blue"),
            }
            ui = await api.get(
                "/ui/",
            )
            listed_cells = cells(ui.text, "experiment")
            assert {
                names[k]: (v["priority_class"], v["team"]) for k, v in listed_cells.items()
            } == {n: (c, t) for n, (_, c, t, *_rest) in EXPECTED.items()}

            # Negative control: every work message taken and acknowledged, the slot
            # given back: nothing waits, in every view.
            await js.add_consumer(
                topology.work_stream,
                ConsumerConfig(
                    durable_name="drain",
                    ack_policy=AckPolicy.EXPLICIT,
                    filter_subject=topology.work_wildcard,
                ),
            )
            drain = await js.pull_subscribe_bind("drain", stream=topology.work_stream)
            for msg in await drain.fetch(http["queued"] + 1, timeout=30):
                await msg.ack_sync()
            await coordinator.release(lease)
            http, cli_view, html = await views()
            assert http == cli_view == {"queued": 0, "groups": [], "experiments": []}
            assert "Nothing waits" in html and cells(html, "experiment") == {}
    finally:
        await ledger.close()
        await nc.close()
