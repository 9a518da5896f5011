"""The experiment page's trial table, paged (100 rows), served by a real uvicorn
server against the real nats-server and ledger, read as a browser without
JavaScript reads it: follow the next / previous links. Every trial appears on
exactly one page, the rows add up to the JSON report's counts and the leaderboard's
means, and the live feed of a page sends that page's rows only.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from schemas.record import PhaseTiming, Provenance, TrialRecord
from schemas.subjects import Topology
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.ports import ExperimentInfo
from tests.support.dashboard_site import served_api, site_settings
from tests.support.records import single_reward

pytestmark = pytest.mark.integration

TOKEN = "page-token-1679091c5a880faf"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE_S = 30.0
EXP = "dash-paging"
N = 250
ROW = re.compile(
    r'<tr class="status-(?P<status>[\w-]+)">\s*<td><a href="[^"]+"><code>(?P<id>[^<]+)</code>'
    r"</a></td><td>(?P<task>[^<]*)</td><td>(?P<agent>[^<]*)</td>\s*<td>[^<]*</td>"
    r'<td class="num">(?P<reward>[^<]*)</td>'
)


def _record(i: int) -> TrialRecord:
    start = datetime(2026, 11, 26, 7, 0, tzinfo=UTC) + timedelta(seconds=i)
    reward = None if i % 7 == 0 else float(i % 3 == 0)
    return TrialRecord(
        trial_id=f"{EXP}-{i:04d}",
        experiment_id=EXP,
        status="complete",
        provenance=Provenance(task_name=f"task-{i % 25:02d}", agent_name=("a", "b")[i % 2]),
        timing=PhaseTiming(started_at=start, finished_at=start + timedelta(seconds=5)),
        evaluation=single_reward(reward, "none" if reward is not None else "verifier"),
    )


@pytest.fixture
async def server(
    tmp_path: Path, nats_url: str, ledger_url: str, topology: Topology, ledger_db: str
) -> AsyncIterator[str]:
    """The submitter app on a ledger holding one experiment of ``N`` records."""
    ledger = MongoLedger(ledger_url, ledger_db)
    try:
        await ledger.ensure_indexes()
        manifest = {"agents": [{"name": "a"}, {"name": "b"}]}
        await ledger.upsert_experiment(ExperimentInfo(EXP, "paging", N + 10, manifest))
        await ledger.upsert_records([_record(i) for i in range(N)])
    finally:
        await ledger.close()
    settings = site_settings(tmp_path, nats_url, ledger_url, ledger_db, topology.prefix, TOKEN)
    async with served_api(settings) as base:
        yield base


def _rows(page: str) -> list[dict[str, str]]:
    return [m.groupdict() for m in ROW.finditer(page)]


def _link(page: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}">', page)
    return html.unescape(found.group(1)) if found else None


async def test_every_trial_on_one_page_and_the_numbers_of_the_report(server: str) -> None:
    async with httpx.AsyncClient(base_url=server, headers=BEARER, timeout=DEADLINE_S) as web:
        first = await web.get(f"/ui/experiments/{EXP}")
        assert first.status_code == 200
        assert _link(first.text, "prev") is None and "page 1 of 3" in first.text
        assert f'data-events-url="/ui/experiments/{EXP}/events?page=1"' in first.text
        pages, url = [first.text], _link(first.text, "next")
        while url is not None:  # as a browser without JavaScript: follow "next"
            page = (await web.get(url)).text
            pages.append(page)
            url = _link(page, "next")
        assert [len(_rows(p)) for p in pages] == [100, 100, 50]
        assert "Trials 101&ndash;200 of 250" in pages[1]
        assert _link(pages[2], "prev") == f"/ui/experiments/{EXP}?page=2#trials"
        # A page past the end shows the last one (a bookmark outliving a shrink).
        assert _rows((await web.get(f"/ui/experiments/{EXP}?page=99")).text) == _rows(pages[2])

        rows = [r for p in pages for r in _rows(p)]
        assert sorted(r["id"] for r in rows) == [f"{EXP}-{i:04d}" for i in range(N)]
        report = (await web.get(f"/experiments/{EXP}/report")).json()
        board = (await web.get(f"/experiments/{EXP}/leaderboard")).json()
    assert len(rows) == report["status"]["recorded"]
    assert sum(r["reward"] == "unscored" for r in rows) == report["status"]["unscored"]
    for entry in board:
        mine = [r["reward"] for r in rows if r["agent"] == entry["agent"]]
        scored = [float(x) for x in mine if x != "unscored"]
        assert len(scored) == entry["n_scored"]
        assert sum(scored) / len(scored) == pytest.approx(entry["mean_reward"], abs=5e-4)


async def _first_progress(web: httpx.AsyncClient, url: str) -> dict[str, object]:
    async with web.stream("GET", url) as response:
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and name == "progress":
                data: dict[str, object] = json.loads(line.removeprefix("data: "))
                return data
    raise AssertionError(f"{url} ended without a progress event")


async def test_the_live_feed_sends_the_page_shown(server: str) -> None:
    async with httpx.AsyncClient(base_url=server, headers=BEARER, timeout=DEADLINE_S) as web:
        second = (await web.get(f"/ui/experiments/{EXP}?page=2")).text
        async with asyncio.timeout(DEADLINE_S):
            pushed = await _first_progress(web, f"/ui/experiments/{EXP}/events?page=2")
            other = await _first_progress(web, f"/ui/experiments/{EXP}/events?page=1")
    sections = pushed["sections"]
    assert isinstance(sections, dict)
    assert _rows(sections["trials"]) == _rows(second) and len(_rows(second)) == 100
    # Negative control: page 1's feed carries other rows.
    other_sections = other["sections"]
    assert isinstance(other_sections, dict)
    assert not {r["id"] for r in _rows(other_sections["trials"])} & {r["id"] for r in _rows(second)}
