"""The trial page's phase timeline and stored-folder downloads, served by a real
uvicorn on the real nats-server (the results bucket) and ledger.

A trial folder packed as a runner packs it is stored in the results bucket and named
by its record. The page draws the phases and lists the folder's files; every link
answers the stored bytes as an attachment with a safe name. Controls: another
experiment's path, no token, a trial without an archive, an archive gone from the
bucket, a file not in the archive: each refused, naming what is missing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from schemas.objects import ObjectRef
from schemas.record import Artifacts, Evaluation, PhaseTiming, Provenance, TrialRecord
from schemas.subjects import Topology
from services.common.adapters.nats_objects import open_bucket
from services.common.archive import pack_trial
from services.submitter.http_security import SESSION_COOKIE
from tests.e2e.cli import ROOT
from tests.support.dashboard_site import chromium_path, logged_in_page, served_api
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "arts-token-c4ca4238a0b92382"
DEADLINE_S = 60.0
SHOTS = ROOT / ".trialbus" / "screenshots"
T0 = datetime(2026, 11, 26, 7, 0, tzinfo=UTC)
FILES = {
    "result.json": b'{"reward": 1.0}',
    "agent/trajectory.json": b"[1, 2, 3]",
    "verifier/test-stdout.txt": b"1 passed\n",
    "page.html": b"<script>alert(document.cookie)</script>",
}


@dataclass
class Site:
    """The test's API and what it stored."""

    base: str
    refs: dict[str, ObjectRef]

    def web(self, **kw: object) -> httpx.AsyncClient:
        """A client logged in with the session cookie (``kw`` replaces it)."""
        kw.setdefault("cookies", {SESSION_COOKIE: TOKEN})
        return httpx.AsyncClient(base_url=self.base, timeout=DEADLINE_S, **kw)  # type: ignore[arg-type]


def _record(exp: str, trial: str, archive: ObjectRef | None) -> TrialRecord:
    return TrialRecord(
        trial_id=trial,
        experiment_id=exp,
        status="complete",
        provenance=Provenance(task_name="hello", agent_name="oracle"),
        timing=PhaseTiming(
            started_at=T0,
            finished_at=T0 + timedelta(seconds=100),
            total_s=100.0,
            environment_setup_s=10.0,
            agent_setup_s=5.0,
            agent_execution_s=60.0,
            verifier_s=20.0,
            phase_offsets_s={
                "environment_setup": 0.5,
                "agent_setup": 11.0,
                "agent_execution": 16.0,
                "verifier": 79.0,
            },
        ),
        evaluation=Evaluation(
            rewards={"reward": 1.0}, main_reward_key="reward", main_reward=1.0, reward_valid=True
        ),
        artifacts=Artifacts(archive=archive),
    )


@pytest.fixture
async def site(tmp_path: Path, servers: Servers, topology: Topology) -> AsyncIterator[Site]:
    settings = servers.site_settings(TOKEN)
    nc = await servers.connect()
    ledger = servers.ledger()
    store = await open_bucket(nc.jetstream(), settings, "results")
    refs: dict[str, ObjectRef] = {}
    for exp in ("arts-a", "arts-b"):
        folder = tmp_path / exp
        for rel, body in FILES.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(body + exp.encode())
        refs[exp] = await store.put(f"{exp}/run-1/1.tar.gz", pack_trial(folder).data)
    gone = await store.put("arts-a/run-gone/1.tar.gz", pack_trial(tmp_path / "arts-a").data)
    await store.delete(gone.name)
    await ledger.upsert_records(
        [
            _record("arts-a", "arts-a-t1", refs["arts-a"]),
            _record("arts-b", "arts-b-t1", refs["arts-b"]),
            _record("arts-a", "arts-a-none", None),
            _record("arts-a", "arts-a-gone", gone),
        ]
    )
    try:
        async with served_api(settings) as base:
            yield Site(base, refs)
    finally:
        await ledger.close()
        await nc.close()


async def test_the_trial_page_draws_the_phases_and_serves_the_stored_folder(site: Site) -> None:
    async with site.web() as web:
        page = await web.get("/ui/trials/arts-a-t1")
        assert page.status_code == 200, page.text
        html = page.text
        # The timeline: one bar per phase, each named with its start and duration.
        phases = re.findall(r'<g class="phase ([a-z_]+)"><title>([^<]+)</title>', html)
        assert [p for p, _ in phases] == [
            "environment_setup",
            "agent_setup",
            "agent_execution",
            "verifier",
        ]
        assert dict(phases)["verifier"] == "verifier: 20.0 s, from +79.0 s"
        assert "drawn one after the other" not in html  # the record has real starts

        # Every listed file downloads as the bytes stored, as an attachment.
        links = dict(re.findall(r'<a href="([^"]+/files/[^"]+)" download>([^<]+)</a>', html))
        assert set(links.values()) >= set(FILES)
        for url, path in links.items():
            r = await web.get(url)
            assert r.status_code == 200, (path, r.text)
            if path in FILES:
                assert r.content == FILES[path] + b"arts-a"
            name = path.rsplit("/", 1)[-1]
            assert r.headers["content-disposition"] == f'attachment; filename="{name}"'
            assert r.headers["content-type"] == "application/octet-stream"
            assert r.headers["x-content-type-options"] == "nosniff"

        archive = re.search(r'<a id="archive-download" href="([^"]+)"', html)
        assert archive is not None
        r = await web.get(archive.group(1))
        assert r.status_code == 200
        assert hashlib.sha256(r.content).hexdigest() == site.refs["arts-a"].sha256
        assert r.headers["content-type"] == "application/gzip"
        assert r.headers["content-disposition"] == 'attachment; filename="arts-a-t1.tar.gz"'
    # A client with the token in the header (curl, a notebook) downloads the same.
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with site.web(cookies={}, headers=bearer) as api:
        r = await api.get("/ui/experiments/arts-b/trials/arts-b-t1/files/result.json")
        assert (r.status_code, r.content) == (200, FILES["result.json"] + b"arts-b")


async def test_downloads_refuse_what_is_not_there_or_not_theirs(site: Site) -> None:
    base = "/ui/experiments/arts-a/trials"
    async with site.web() as web:
        # Another experiment's trial through this experiment's path: not served.
        r = await web.get("/ui/experiments/arts-b/trials/arts-a-t1/archive")
        assert r.status_code == 404
        assert "trial &#39;arts-a-t1&#39; is not a trial of experiment &#39;arts-b&#39;" in r.text
        r = await web.get("/ui/experiments/arts-b/trials/arts-a-t1/files/result.json")
        assert r.status_code == 404 and "content-disposition" not in r.headers
        # Control: the same trial under its own experiment is served.
        assert (await web.get(f"{base}/arts-a-t1/archive")).status_code == 200

        missing = {
            f"{base}/arts-a-none/archive": "has no stored archive",
            f"{base}/arts-a-gone/archive": "is no longer in bucket",
            f"{base}/arts-a-nobody/archive": "no record of trial &#39;arts-a-nobody&#39;",
            f"{base}/arts-a-t1/files/agent/missing.txt": (
                "no file &#39;agent/missing.txt&#39; in trial &#39;arts-a-t1&#39;"
            ),
            f"{base}/arts-a-t1/files/agent": "no file &#39;agent&#39;",
        }
        for url, why in missing.items():
            r = await web.get(url)
            assert r.status_code == 404, url
            assert why in r.text, (url, r.text)
            assert "content-disposition" not in r.headers

        # A trial without a stored folder says so on its page; one whose archive is
        # gone, why it lists no file.
        assert "No stored folder for this trial." in (await web.get("/ui/trials/arts-a-none")).text
        gone = (await web.get("/ui/trials/arts-a-gone")).text
        assert "is no longer in bucket" in gone and 'id="stored-files"' not in gone

    # No credential: the browser is sent to log in, a client is refused; nothing leaks.
    async with site.web(cookies={}, follow_redirects=False) as anon:
        r = await anon.get(f"{base}/arts-a-t1/archive")
        assert (r.status_code, r.headers.get("location")) == (303, "/ui/login")
        assert "content-disposition" not in r.headers
    wrong = {"Authorization": "Bearer wrong"}
    async with site.web(cookies={}, headers=wrong, follow_redirects=False) as bad:
        r = await bad.get(f"{base}/arts-a-t1/files/result.json")
        # Refused (the guard sends a dashboard path to the login page), nothing served.
        assert (r.status_code, r.headers.get("location")) == (303, "/ui/login")
        assert b"arts-a" not in r.content and "content-disposition" not in r.headers


async def test_the_trial_page_in_a_browser(site: Site) -> None:
    from playwright.async_api import async_playwright

    path = chromium_path()
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with (
        async_playwright() as pw,
        logged_in_page(pw, path, site.base, TOKEN) as (page, errors),
    ):
        await page.goto(f"{site.base}/ui/trials/arts-a-t1")
        bar = page.locator("svg.timeline g.agent_execution rect")
        box = await bar.bounding_box()
        assert box is not None and box["width"] > 100  # 60 of 100 s, drawn
        # A download from the page arrives as a file with its safe name.
        async with page.expect_download() as info:
            await page.click("#stored-files a >> text=agent/trajectory.json")
        download = await info.value
        assert download.suggested_filename == "trajectory.json"
        await page.screenshot(path=str(SHOTS / "trial.png"), full_page=True)
        assert errors == []  # a CSP violation would be one
