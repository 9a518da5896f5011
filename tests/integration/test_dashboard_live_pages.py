"""The fleet and queue pages update live, in Debian's chromium (headless, Playwright),
served by a real uvicorn on the real nats-server and ledger: a runner that joins
appears and one that leaves disappears, a paused experiment's reason turns to
``paused``, all without a reload (a mark set in the page survives) and without the
refresh link. Controls: the same page with JavaScript off shows none of it until it is
reloaded, and then does; the pushes stop repeating when nothing changes. Also the
stream itself (``/ui/runners/events``) over plain HTTP: the page's part, then the
change, and no stream without a token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from nats.js import JetStreamContext

from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.ports import ExperimentInfo
from services.submitter.http_security import SESSION_COOKIE
from tests.e2e.cli import ROOT
from tests.support.dashboard_site import chromium_path, logged_in_page, served_api
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "live-pages-token-8d0c2b9e41a7"
DEADLINE_S = 60.0
PUSH_WAIT_MS = 30_000
"""A push comes within a period (2 s fleet, 5 s queue); generous for a loaded machine."""
SHOTS = ROOT / ".trialbus" / "screenshots"


def _runner(runner_id: str) -> RunnerInfo:
    return RunnerInfo(runner_id=runner_id, host=f"host-{runner_id}", concurrency=2)


async def test_fleet_and_queue_pages_update_without_a_reload(
    servers: Servers, topology: Topology, js: JetStreamContext, ledger: MongoLedger
) -> None:
    from playwright.async_api import async_playwright, expect

    chromium = chromium_path()
    registry = await NatsRunnerRegistry.open(js, topology)
    coordinator = await NatsCoordinator.open(js, topology, lease_ttl_s=60.0)
    await registry.announce(_runner("first"))
    await ledger.upsert_experiment(ExperimentInfo("live-q", "live-q", 2, {}))
    for i in range(2):
        await js.publish(topology.work_subject("live-q", "default", None), f"{i}".encode())
    settings = servers.site_settings(TOKEN)
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with (
        served_api(settings) as base,
        async_playwright() as pw,
        logged_in_page(pw, chromium, base, TOKEN) as (page, errors),
    ):
        # Control page: the same fleet with JavaScript off (the cookie set directly).
        static_browser = await pw.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox"]
        )
        context = await static_browser.new_context(java_script_enabled=False)
        await context.add_cookies([{"name": SESSION_COOKIE, "value": TOKEN, "url": base}])
        static = await context.new_page()
        await static.goto(f"{base}/ui/runners")

        await page.click("header nav a[href='/ui/runners']")
        await page.wait_for_url(f"{base}/ui/runners")
        # (expect, not wait_for_function: the CSP forbids the eval that one uses)
        await expect(page.locator("#live-status")).to_have_text("live", timeout=PUSH_WAIT_MS)
        await page.evaluate("window.__notReloaded = true")
        await registry.announce(_runner("second"))
        await page.wait_for_selector("tr[data-runner='second']", timeout=PUSH_WAIT_MS)
        await registry.withdraw(_runner("first"))
        await page.wait_for_selector(
            "tr[data-runner='first']", state="detached", timeout=PUSH_WAIT_MS
        )
        assert await page.evaluate("window.__notReloaded === true")
        summary = await page.locator("#fleet-summary").inner_text()
        assert summary.startswith("1 runner ·"), summary
        await page.screenshot(path=str(SHOTS / "runners-live.png"), full_page=True)
        # Control: without the script nothing changed on its own...
        assert await static.locator("tr[data-runner='first']").count() == 1
        assert await static.locator("tr[data-runner='second']").count() == 0
        # ...and the refresh link (a reload) shows what the live page showed.
        await static.click("#refresh")
        await static.wait_for_selector("tr[data-runner='second']")
        assert await static.locator("tr[data-runner='first']").count() == 0
        await static_browser.close()

        # The queue page: live-q waits its turn, then is paused, without a reload.
        await page.click("header nav a[href='/ui/queue']")
        await page.wait_for_url(f"{base}/ui/queue")
        reason = page.locator("tr[data-experiment='live-q'] [data-field=reason]")
        assert (await reason.inner_text()).strip() != "paused"
        await page.evaluate("window.__notReloaded = true")
        await coordinator.pause("live-q")
        await expect(reason).to_have_text("paused", timeout=PUSH_WAIT_MS)
        assert await page.evaluate("window.__notReloaded === true")
        await page.screenshot(path=str(SHOTS / "queue-live.png"), full_page=True)
        assert errors == []


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(event, data) of a Server-Sent Events answer, as they come."""
    event = ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield event, json.loads(line.removeprefix("data: "))


async def test_the_fleet_stream_pushes_changes(
    servers: Servers, topology: Topology, js: JetStreamContext
) -> None:
    registry = await NatsRunnerRegistry.open(js, topology)
    await registry.announce(_runner("alpha"))
    settings = servers.site_settings(TOKEN)
    async with (
        served_api(settings) as base,
        httpx.AsyncClient(base_url=base, timeout=DEADLINE_S) as web,
    ):
        # No token, no stream (the dashboard's guard: to the login page).
        refused = await web.get("/ui/runners/events")
        assert (refused.status_code, refused.headers["location"]) == (303, "/ui/login")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            asyncio.timeout(DEADLINE_S),
            web.stream("GET", "/ui/runners/events", headers=headers) as answer,
        ):
            assert answer.headers["content-type"].startswith("text/event-stream")
            seen = _events(answer)
            event, first = await anext(seen)
            assert (event, first["target"]) == ("page", "fleet")
            assert 'data-runner="alpha"' in first["html"]
            assert 'data-runner="beta"' not in first["html"]  # control
            await registry.announce(_runner("beta"))
            started = time.monotonic()
            while True:
                event, data = await anext(seen)
                if event == "page" and 'data-runner="beta"' in data["html"]:
                    break
            # Within a couple of periods of the change (2 s each), not a beat (40 s).
            assert time.monotonic() - started < 20.0
