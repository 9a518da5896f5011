"""The queue page in Debian's chromium (headless, Playwright), served by a real uvicorn
on the real nats-server and ledger: reached from the header's link, it shows what
``GET /queue`` says (a paused experiment and one waiting its turn, each with its team
and class), one card per row at phone width with no sideways scroll, and the refresh
link reads the queue again (control: the resumed experiment's reason changes)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from nats.js import JetStreamContext

from schemas.subjects import Topology
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import ExperimentInfo
from tests.e2e.cli import ROOT
from tests.support.dashboard_site import chromium_path, logged_in_page, served_api
from tests.support.live_runner import announce_live_runner
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "queue-token-5f1e2d3c4b5a6978"
DEADLINE_S = 60.0
SHOTS = ROOT / ".trialbus" / "screenshots"


async def test_queue_page_in_a_browser(
    servers: Servers, topology: Topology, js: JetStreamContext, ledger: MongoLedger
) -> None:
    from playwright.async_api import async_playwright

    chromium = chromium_path()
    coordinator = await NatsCoordinator.open(js, topology, lease_ttl_s=60.0)
    await announce_live_runner(js, topology, concurrency=1)
    experiments = {
        "held-sweep": ("blue", "batch", 3),
        "release-check": ("red", "urgent", 2),
    }
    for exp, (team, cls, n) in experiments.items():
        manifest = {"compute": {"priority_class": cls}, "submitted_by": {"user": "u", "team": team}}
        await ledger.upsert_experiment(ExperimentInfo(exp, exp, n, manifest))
        for i in range(n):
            await js.publish(topology.work_subject(exp, "default", cls), f"{i}".encode())
    await coordinator.pause("held-sweep")
    settings = servers.site_settings(TOKEN)
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with served_api(settings) as base, async_playwright() as pw:
        async with httpx.AsyncClient(base_url=base, timeout=DEADLINE_S) as web:
            answer = await web.get("/queue", headers={"Authorization": f"Bearer {TOKEN}"})
        api = {e["experiment_id"]: e for e in answer.json()["experiments"]}
        assert {k: v["reason"] for k, v in api.items()} == {
            "held-sweep": "paused",
            "release-check": "priority",
        }
        async with logged_in_page(pw, chromium, base, TOKEN) as (page, errors):
            await page.click("header nav a[href='/ui/queue']")
            await page.wait_for_url(f"{base}/ui/queue")
            for exp, row in api.items():
                shown = page.locator(f"tr[data-experiment='{exp}']")
                for field in ("team", "priority_class", "queued", "reason"):
                    cell = await shown.locator(f"[data-field={field}]").inner_text()
                    assert cell.strip() == str(row[field]), (exp, field)
            await page.screenshot(path=str(SHOTS / "queue.png"), full_page=True)
            await page.set_viewport_size({"width": 390, "height": 800})
            wide = await page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"the queue page scrolls sideways at 390 px ({wide} px)"
            await page.screenshot(path=str(SHOTS / "queue-phone.png"), full_page=True)
            # Refresh reads the queue again: resumed, the sweep waits its turn (the
            # server may answer from its 1 s flag cache once more).
            await coordinator.resume("held-sweep")
            reason = page.locator("tr[data-experiment='held-sweep'] [data-field=reason]")
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                await page.click("#refresh")
                await page.wait_for_load_state()
                if (await reason.inner_text()).strip() == "priority":
                    break
                assert asyncio.get_running_loop().time() < deadline, "still paused"
            assert errors == []
