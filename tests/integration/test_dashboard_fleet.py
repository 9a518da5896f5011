"""The runner fleet, one read path: the dashboard's ``/ui/runners``, ``GET /runners``
and ``trialbus runners --json`` give the same numbers, from the registry's heartbeat
records on the real nats-server, served by a real uvicorn; and the page in Debian's
chromium (headless, Playwright).

One runner beats through the runners' own ``heartbeat`` (its load rewritten as it
changes), one record is written with a last heartbeat long past (stale), one as a
runner older than the load fields writes it. Controls: the stale runner is marked,
the fresh one is not; a change of load reaches every view; a withdrawn runner leaves
them; no token, no fleet.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.runners import RunnerInfo, RunnerLoad
from schemas.subjects import Topology
from services.common.adapters.nats_registry import NatsRunnerRegistry, heartbeat
from services.submitter.http_security import SESSION_COOKIE
from tests.e2e.cli import ROOT, run_module
from tests.support.dashboard_site import chromium_path, logged_in_page, served_api
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "fleet-token-1679091c5a880faf"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE_S = 60.0
TTL_S = 120.0
"""The bucket's max age: a beat every 40 s, stale after 80 s; the stale record (last
heartbeat 100 s before it was written) stays listed 120 s, far longer than the test."""
SHOTS = ROOT / ".trialbus" / "screenshots"
COMPARED = (
    *("host", "pool", "capabilities", "labels", "concurrency"),
    *("in_flight", "done", "failed", "stale", "api_keys"),
)


@dataclass
class Fleet:
    """The test's registry, its HTTP API and the CLI's environment."""

    registry: NatsRunnerRegistry
    base: str
    env: dict[str, str]

    def web(self, **kw: Any) -> httpx.AsyncClient:
        """A client of the API (``kw``: headers, cookies)."""
        return httpx.AsyncClient(base_url=self.base, timeout=DEADLINE_S, **kw)

    async def json_rows(self) -> dict[str, dict[str, Any]]:
        """``GET /runners`` by runner id."""
        async with self.web(headers=BEARER) as web:
            r = await web.get("/runners")
        assert r.status_code == 200, r.text
        return {row["runner_id"]: row for row in r.json()}

    async def cli_rows(self) -> dict[str, dict[str, Any]]:
        """``trialbus runners --json`` by runner id."""
        import json

        done = await asyncio.to_thread(run_module, self.env, "runners", "--json", timeout=120)
        assert done.returncode == 0, done.stderr
        return {row["runner_id"]: row for row in json.loads(done.stdout)}

    async def page_rows(self) -> dict[str, dict[str, str]]:
        """The fleet page's table: runner id -> {field: cell text}."""
        async with self.web(cookies={SESSION_COOKIE: TOKEN}) as web:
            r = await web.get("/ui/runners")
        assert r.status_code == 200, r.text
        return parse_page(r.text)


def parse_page(html: str) -> dict[str, dict[str, str]]:
    """Each ``<tr data-runner>``'s ``data-field`` cells, as text (tags stripped)."""
    rows: dict[str, dict[str, str]] = {}
    for runner, body in re.findall(r'<tr data-runner="([^"]+)"[^>]*>(.*?)</tr>', html, re.S):
        cells = re.findall(r'data-field="([a-z_]+)"[^>]*>(.*?)</td>', body, re.S)
        rows[runner] = {k: re.sub(r"<[^>]+>", "", v).strip() for k, v in cells}
    return rows


def page_numbers(row: dict[str, Any]) -> dict[str, str]:
    """A JSON row as the page words it."""

    def count(n: int | None) -> str:
        return "-" if n is None else str(n)

    offers = ", ".join([*row["capabilities"], *(f"{x} (label)" for x in row["labels"])])
    return {
        "host": row["host"],
        "pool": row["pool"],
        "offers": offers or "-",
        "concurrency": str(row["concurrency"]),
        "in_flight": count(row["in_flight"]),
        "done": count(row["done"]),
        "failed": count(row["failed"]),
        "state": "⚠ stale" if row["stale"] else "✓ live",
        "api_keys": "?" if row["api_keys"] is None else ", ".join(row["api_keys"]) or "-",
    }


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait (``DEADLINE_S``) until ``check`` holds."""
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)


@pytest.fixture
async def fleet(tmp_path: Path, servers: Servers, topology: Topology) -> AsyncIterator[Fleet]:
    nc = await servers.connect()
    js = nc.jetstream()
    registry = await NatsRunnerRegistry.open(js, topology, create_ttl_s=TTL_S)
    settings = servers.site_settings(TOKEN)
    env = servers.cli().env
    try:
        async with served_api(settings) as base:
            yield Fleet(registry, base, env)
    finally:
        await nc.close()


def _runners() -> tuple[RunnerInfo, RunnerInfo, RunnerInfo]:
    fresh = RunnerInfo(
        runner_id="hostA-1",
        host="hostA",
        capabilities=["local"],
        labels=["gpu"],
        concurrency=4,
        secrets_set=["ANTHROPIC_API_KEY", "OPENAI_API_KEY"],
    )
    stale = RunnerInfo(
        runner_id="hostB-2",
        host="hostB",
        pool="big",
        concurrency=2,
        last_seen=datetime.now(UTC) - timedelta(seconds=100),
        in_flight=1,
        done=3,
        failed=2,
    )
    # A runner from before the load fields: its counts are unknown, never 0.
    old = RunnerInfo(runner_id="hostC-3", host="hostC", concurrency=1)
    return fresh, stale, old


async def test_page_json_and_cli_show_one_fleet(fleet: Fleet) -> None:
    fresh, stale, old = _runners()
    load = RunnerLoad(in_flight=2, done=5, failed=1)
    await fleet.registry.announce(stale)
    await fleet.registry.announce(old)
    async with heartbeat(fleet.registry, fresh, fleet.registry.heartbeat_s, lambda: load):
        api, cli, page = await fleet.json_rows(), await fleet.cli_rows(), await fleet.page_rows()
        assert set(api) == set(cli) == set(page) == {"hostA-1", "hostB-2", "hostC-3"}
        for runner_id, row in api.items():
            assert {k: row[k] for k in COMPARED} == {k: cli[runner_id][k] for k in COMPARED}
            shown = {k: v for k, v in page[runner_id].items() if k != "last_seen"}
            assert shown == page_numbers(row), runner_id
        # The stale runner is marked, the fresh one is not (their heartbeats say so).
        assert (api["hostA-1"]["stale"], api["hostB-2"]["stale"]) == (False, True)
        assert (page["hostA-1"]["state"], page["hostB-2"]["state"]) == ("✓ live", "⚠ stale")
        a = api["hostA-1"]
        assert (a["in_flight"], a["done"], a["failed"], a["concurrency"]) == (2, 5, 1, 4)
        assert (api["hostC-3"]["in_flight"], page["hostC-3"]["done"]) == (None, "-")
        assert page["hostA-1"]["offers"] == "local, gpu (label)"
        # Key names only; an older runner's are unknown ("?"), not none ("-").
        assert page["hostA-1"]["api_keys"] == "ANTHROPIC_API_KEY, OPENAI_API_KEY"
        assert (page["hostC-3"]["api_keys"], api["hostC-3"]["api_keys"]) == ("?", None)

        # A change of load is rewritten within seconds, not at the next beat (40 s).
        load = RunnerLoad(in_flight=0, done=7, failed=1)

        async def caught_up() -> bool:
            done: int = (await fleet.json_rows())["hostA-1"]["done"]
            return done == 7

        await until(caught_up, "the fleet shows the runner's new load")
        page = await fleet.page_rows()
        assert (page["hostA-1"]["done"], page["hostA-1"]["in_flight"]) == ("7", "0")
        cli = await fleet.cli_rows()
        assert (cli["hostA-1"]["done"], cli["hostA-1"]["in_flight"]) == (7, 0)
    # Stopped cleanly: withdrawn, so every view lists one runner fewer.
    api, page = await fleet.json_rows(), await fleet.page_rows()
    assert set(api) == set(page) == {"hostB-2", "hostC-3"}


async def test_the_fleet_needs_a_token(fleet: Fleet) -> None:
    async with fleet.web() as web:
        assert (await web.get("/runners")).status_code == 401
        r = await web.get("/ui/runners")
        assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    async with fleet.web(headers={"Authorization": "Bearer not-a-token"}) as web:
        assert (await web.get("/runners")).status_code == 401
    # Control: the same requests with the token are answered.
    async with fleet.web(headers=BEARER) as web:
        assert (await web.get("/runners")).status_code == 200
        assert (await web.get("/ui/runners")).status_code == 200


async def test_fleet_page_in_a_browser(fleet: Fleet) -> None:
    from playwright.async_api import async_playwright

    chromium = chromium_path()
    fresh, stale, _old = _runners()
    await fleet.registry.announce(stale)
    SHOTS.mkdir(parents=True, exist_ok=True)
    load = RunnerLoad(in_flight=1, done=2, failed=0)
    async with (
        heartbeat(fleet.registry, fresh, fleet.registry.heartbeat_s, lambda: load),
        async_playwright() as pw,
        logged_in_page(pw, chromium, fleet.base, TOKEN) as (page, errors),
    ):
        # Reached from the navigation, as a person would.
        await page.click("header nav a[href='/ui/runners']")
        await page.wait_for_url(f"{fleet.base}/ui/runners")
        stale_row = page.locator("tr[data-runner='hostB-2']")
        fresh_row = page.locator("tr[data-runner='hostA-1']")
        assert await stale_row.get_attribute("class") == "runner-stale"
        assert await fresh_row.get_attribute("class") == "runner-live"
        assert "stale" in await stale_row.locator("[data-field=state]").inner_text()
        assert "live" in await fresh_row.locator("[data-field=state]").inner_text()
        api = await fleet.json_rows()
        for runner_id in ("hostA-1", "hostB-2"):
            row = page.locator(f"tr[data-runner='{runner_id}']")
            for field in ("in_flight", "done", "failed", "concurrency"):
                cell = await row.locator(f"[data-field={field}]").inner_text()
                assert cell == page_numbers(api[runner_id])[field], (runner_id, field)
        await page.screenshot(path=str(SHOTS / "runners.png"), full_page=True)
        # Phone width: one card per runner, no sideways scroll.
        await page.set_viewport_size({"width": 390, "height": 800})
        wide = await page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"the fleet page scrolls sideways at 390 px ({wide} px)"
        await page.screenshot(path=str(SHOTS / "runners-phone.png"), full_page=True)
        # The refresh link reads the registry again: a withdrawn runner is gone.
        await fleet.registry.withdraw(stale)
        await page.click("#refresh")
        await page.wait_for_selector("tr[data-runner='hostB-2']", state="detached")
        assert await fresh_row.count() == 1
        assert errors == []
