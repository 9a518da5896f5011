"""The dashboard as a person uses it: Debian's chromium (headless, driven by Playwright)
against a real stack running real trials. It logs in with the stack's token, opens
the experiment page while the trials run, and watches the page update over SSE, with
no reload, until the experiment completes; the leaderboard it shows, and its error
bars, carry the numbers of `trialbus leaderboard --json`; the task x agent matrix is
there, as cards at phone width; the static parts need no JavaScript; a trial's page
shows its record.

Screenshots go to .trialbus/screenshots/ (not in git) for humans to look at.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.e2e.cli import ROOT
from tests.e2e.conftest import Stacks
from tests.support.dashboard_site import chromium_path

pytestmark = pytest.mark.e2e

TASKS = ROOT / "examples" / "tasks"
SHOTS = ROOT / ".trialbus" / "screenshots"
# Four trials, one at a time: the page is open well before the last one is recorded.
MANIFEST = f"""\
name: dashboard-browser
tasks: ["{TASKS / "hello-file"}", "{TASKS / "count-words"}"]
agents: [{{name: oracle}}, {{name: nop}}]
repetitions: 1
compute: {{environment: local, n_concurrent_trials: 1}}
"""
DEADLINE_S = 90.0


def _wait_known(api: httpx.Client, experiment_id: str) -> None:
    """Until the ledger knows the experiment (the importer records its submission)."""
    deadline = time.monotonic() + DEADLINE_S
    while api.get(f"/experiments/{experiment_id}/status").status_code != 200:
        assert time.monotonic() < deadline, f"{experiment_id} never reached the ledger"
        time.sleep(0.2)


async def test_experiment_page_updates_live_until_complete(stacks: Stacks) -> None:
    from playwright.async_api import async_playwright

    chromium = chromium_path()
    stack = await stacks.start(concurrency=1)
    base = f"http://127.0.0.1:{stack.http_port}"
    token = stack.api_token_path.read_text().strip()
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=chromium, headless=True, args=["--no-sandbox"]
            )
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(
                "console",
                lambda msg: errors.append(msg.text) if msg.type == "error" else None,
            )

            # Not logged in: a page sends the browser to the login form.
            await page.goto(f"{base}/ui/")
            assert page.url.endswith("/ui/login")
            await page.fill("#token", token)
            await page.click("button[type=submit]")
            await page.wait_for_url(f"{base}/ui/")

            # Submitted only now (the browser is ready), so the page opens mid-run.
            posted = await asyncio.to_thread(
                api.post,
                "/experiments",
                content=MANIFEST,
                headers={"Content-Type": "application/yaml"},
            )
            assert posted.status_code == 202, posted.text
            summary = posted.json()
            exp = summary["experiment_id"]
            await asyncio.to_thread(_wait_known, api, exp)
            await page.goto(f"{base}/ui/")
            await page.click(f"a[href='/ui/experiments/{exp}']")
            await page.wait_for_url(f"{base}/ui/experiments/{exp}")

            # Opened while trials run; the marker survives only if the page never reloads.
            await page.evaluate("window.__sameDocument = true")
            first_done = int(await page.inner_text("[data-count=done]"))
            assert first_done < summary["n_trials"], "every trial was done before the page"
            # A selector, not wait_for_function: the page's CSP forbids eval, rightly.
            await page.wait_for_selector(
                "[data-count=state].state-complete", timeout=DEADLINE_S * 1000
            )
            assert await page.evaluate("window.__sameDocument === true")
            assert int(await page.get_attribute("main", "data-updates") or 0) >= 1
            assert await page.locator("#live-events li").count() >= 1
            assert int(await page.inner_text("[data-count=done]")) == summary["n_trials"]
            await page.screenshot(path=SHOTS / "experiment.png", full_page=True)

            # The leaderboard on the page is `trialbus leaderboard --json`'s, cell by
            # cell, and each row's error bars carry the same numbers.
            rows = await stacks.cli(stack).ajson("leaderboard", exp)
            assert rows == api.get(f"/experiments/{exp}/leaderboard").json()
            shown = await page.eval_on_selector_all(
                "#leaderboard tbody tr",
                "rows => rows.map(r => [...r.cells].filter(c => !c.classList.contains('bars'))"
                ".map(c => c.textContent.trim()))",
            )
            assert shown == [_cells(r) for r in rows]
            assert {r["agent"]: r["n_scored"] for r in rows} == {"oracle": 2, "nop": 2}
            bars = await page.eval_on_selector_all(
                "#leaderboard svg.bars", "svgs => svgs.map(s => s.getAttribute('aria-label'))"
            )
            assert bars == [_bars_label(r) for r in rows]
            # The task x agent matrix: 2 tasks x 2 agents, each cell a symbol and words.
            cells = await page.eval_on_selector_all(
                "#matrix td.cell", "cells => cells.map(c => c.textContent.trim())"
            )
            assert sorted(cells) == ["✓ 1/1 passed"] * 2 + ["✗ 0/1 passed"] * 2, cells

            # At phone width the matrix is one card per task: no sideways scroll.
            await page.set_viewport_size({"width": 390, "height": 844})
            assert await page.evaluate(
                "(() => { const m = document.getElementById('matrix');"
                " return m.scrollWidth <= m.clientWidth"
                " && getComputedStyle(m.querySelector('thead')).display === 'none'"
                " && getComputedStyle(m.querySelector('td.cell')).display === 'block'; })()"
            )
            await page.screenshot(path=SHOTS / "experiment-phone.png", full_page=True)
            await page.set_viewport_size({"width": 1280, "height": 800})

            # Without JavaScript the static parts are all there (bars, matrix).
            still = await browser.new_context(
                java_script_enabled=False, storage_state=await page.context.storage_state()
            )
            static_page = await still.new_page()
            await static_page.goto(f"{base}/ui/experiments/{exp}")
            assert await static_page.locator("#leaderboard svg.bars").count() == len(rows)
            assert await static_page.locator("#matrix td.cell").count() == 4
            assert await static_page.inner_text("#live-status") == "static"
            await still.close()

            # A trial's page: its record.
            await page.click("#trials tbody tr a")
            await page.wait_for_selector("h2:text('Evaluation')")
            await page.screenshot(path=SHOTS / "trial.png", full_page=True)
            await page.goto(f"{base}/ui/")
            await page.screenshot(path=SHOTS / "experiments.png", full_page=True)
            assert errors == [], errors  # no script error, no CSP violation, no refusal
            await browser.close()
    finally:
        api.close()


def _cells(row: dict[str, Any]) -> list[str]:
    from services.submitter.dashboard_views import leaderboard_cells

    cells = leaderboard_cells(row)
    return [cells[k] for k in ("agent", "mean", "pass_rate", "scored", "unscored", "note")]


def _bars_label(row: dict[str, Any]) -> str:
    from services.submitter.dashboard_charts import bars_label

    return bars_label(row)
