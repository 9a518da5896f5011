"""The experiment page's matrix updates cell by cell, in Debian's chromium (headless,
Playwright), served by a real uvicorn on the real nats-server and ledger.

A record arrives (ledger write + ResultImported on the bus, as the importer does): its
cell changes to the new words while the matrix's table stays the same element (a
mark set on it survives, so only the cell was replaced, and the page was not
reloaded), and the cell is what a fresh load of the page shows. Control: a record of
a new task changes the matrix's shape, and the table is replaced whole (the mark is
gone) with the new row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.events import ResultImported
from schemas.record import Provenance, TrialRecord
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.ports import ExperimentInfo
from tests.e2e.cli import ROOT
from tests.support.dashboard_site import chromium_path, logged_in_page, served_api
from tests.support.records import single_reward
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "matrix-token-45c48cce2e2d7fbd"
EXP = "matrix-push"
PUSH_WAIT_MS = 30_000
SHOTS = ROOT / ".trialbus" / "screenshots"
MARKED = "document.querySelector('#matrix table').__marked === true"


def _record(i: int, task: str, agent: str, reward: float) -> TrialRecord:
    return TrialRecord(
        trial_id=f"{EXP}-{i}",
        experiment_id=EXP,
        status="complete",
        provenance=Provenance(task_name=task, agent_name=agent),
        evaluation=single_reward(reward),
    )


async def test_a_new_record_replaces_its_cell_alone(
    tmp_path: Path, servers: Servers, topology: Topology
) -> None:
    from playwright.async_api import async_playwright, expect

    chromium = chromium_path()
    nc = await servers.connect()
    bus = JetStreamBus(nc.jetstream(), topology)
    ledger = servers.ledger()
    manifest = {"agents": [{"name": "oracle"}, {"name": "nop"}]}
    await ledger.upsert_experiment(ExperimentInfo(EXP, EXP, 8, manifest))
    await ledger.upsert_records(
        [_record(i, f"t{i // 2}", ("oracle", "nop")[i % 2], 1.0 - i % 2) for i in range(4)]
    )
    settings = servers.site_settings(TOKEN)

    async def arrives(record: TrialRecord) -> None:
        await ledger.upsert_records([record])
        await bus.publish(
            ResultImported(
                experiment_id=EXP, trial_id=record.trial_id, status="complete", scored=True,
                main_reward=record.evaluation.main_reward, changed=True,
            )
        )  # fmt: skip

    try:
        async with (
            served_api(settings) as base,
            async_playwright() as pw,
            logged_in_page(pw, chromium, base, TOKEN) as (page, errors),
        ):
            await page.goto(f"{base}/ui/experiments/{EXP}")
            await expect(page.locator("#live-status")).to_have_text("live", timeout=PUSH_WAIT_MS)
            nop_t1 = page.locator("#matrix tr:has(th:text-is('t1')) td[data-agent='nop']")
            assert "0/1 passed" in await nop_t1.inner_text()
            await page.evaluate("document.querySelector('#matrix table').__marked = true")

            await arrives(_record(4, "t1", "nop", 1.0))
            await expect(nop_t1).to_contain_text("1/2 passed", timeout=PUSH_WAIT_MS)
            assert await page.evaluate(MARKED), "the matrix was replaced whole, not its cell"
            cell = await nop_t1.evaluate("el => el.outerHTML")
            nop_t0 = page.locator("#matrix tr:has(th:text-is('t0')) td[data-agent='nop']")
            assert "0/1 passed" in await nop_t0.inner_text()  # the other cells as they were
            await page.screenshot(path=str(SHOTS / "matrix-push.png"), full_page=True)

            # Control: a new task is a new row: the table is replaced whole.
            await arrives(_record(5, "t2", "oracle", 1.0))
            new_row = page.locator("#matrix tr:has(th:text-is('t2'))")
            await expect(new_row).to_have_count(1, timeout=PUSH_WAIT_MS)
            assert not await page.evaluate(MARKED)
            assert errors == []

            # What was pushed is what a fresh load of the page shows.
            await page.reload()
            assert await nop_t1.evaluate("el => el.outerHTML") == cell
    finally:
        await ledger.close()
        await nc.close()
