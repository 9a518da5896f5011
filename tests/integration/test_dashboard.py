"""The web dashboard (/ui/) served by a real uvicorn server, against the real
nats-server and ledger: login and the session cookie, escaping, the security headers,
the numbers of the JSON API, the filter, and both Server-Sent Events streams.

SSE needs a real server: httpx's ASGI transport buffers a whole response, and an event
stream never ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import markupsafe
import nats
import pytest

from schemas.events import ResultImported, TrialLog, TrialStarted, encode_event
from schemas.record import Evaluation, PhaseTiming, Provenance, TrialRecord
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import ExperimentInfo
from services.submitter.dashboard_views import leaderboard_cells
from services.submitter.http_security import SESSION_COOKIE
from tests.support.dashboard_site import served_api
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "dash-token-8f14e45fceea167a"
EVIL_TASK = "<script>alert('task')</script>"
EVIL_AGENT = '<img src=x onerror="alert(1)">'
EVIL_NAME = "<b>bold</b> & co"
DEADLINE_S = 20.0


@pytest.fixture
async def server(servers: Servers) -> AsyncIterator[str]:
    """A submitter app under uvicorn on a free loopback port; its base URL."""
    settings = servers.site_settings(TOKEN, "user: ada, team: t1")
    async with served_api(settings) as base:
        yield base


def _record(exp: str, i: int, reward: float | None, task: str, agent: str) -> TrialRecord:
    start = datetime(2026, 11, 26, 7, 0, tzinfo=UTC) + timedelta(seconds=10 * i)
    return TrialRecord(
        trial_id=f"{exp}-trial-{i}",
        experiment_id=exp,
        status="complete",
        provenance=Provenance(task_name=task, agent_name=agent, runner_host="host-a"),
        timing=PhaseTiming(started_at=start, finished_at=start + timedelta(seconds=5)),
        evaluation=Evaluation(
            rewards={} if reward is None else {"reward": reward},
            main_reward_key=None if reward is None else "reward",
            main_reward=reward,
            reward_valid=reward is not None,
            failure_class="none" if reward is not None else "verifier",
            exception_message=None if reward is not None else "<i>verifier</i> broke",
        ),
        errors=[] if reward is not None else ["<script>err</script> in result.json"],
    )


async def _seed(ledger: MongoLedger, exp: str, name: str, n_trials: int, n_records: int) -> None:
    manifest = {"agents": [{"name": EVIL_AGENT}], "submitted_by": {"user": "ada", "team": "t1"}}
    await ledger.upsert_experiment(ExperimentInfo(exp, name, n_trials, manifest))
    rewards = [1.0, 0.0, 1.0, 1.0, None, 1.0, 0.0, 1.0]
    await ledger.upsert_records(
        [
            _record(exp, i, rewards[i % len(rewards)], EVIL_TASK, EVIL_AGENT)
            for i in range(n_records)
        ]
    )


def _client(base: str, **kw: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=DEADLINE_S, **kw)  # type: ignore[arg-type]


BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _assert_secure_page(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    # No inline script: every <script> element loads a file of this origin.
    assert re.findall(r"<script[^>]*>", r.text) == ['<script src="/ui/static/dashboard.js" defer>']


async def test_a_browser_logs_in_with_a_cookie_that_only_reads(server: str) -> None:
    async with _client(server) as web:
        # Without a credential a page sends the browser to the login page; JSON stays 401.
        r = await web.get("/ui/")
        assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
        assert (await web.get("/experiments/x/status")).status_code == 401
        assert (await web.get("/ui/login")).status_code == 200

        bad = await web.post("/ui/login", data={"token": TOKEN + "x"})
        assert bad.status_code == 401 and "Unknown token" in bad.text
        assert "set-cookie" not in bad.headers

        good = await web.post("/ui/login", data={"token": TOKEN})
        assert good.status_code == 303
        cookie = good.headers["set-cookie"]
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/ui"):
            assert attribute.lower() in cookie.lower(), cookie
        _assert_secure_page(await web.get("/ui/"))  # the client keeps the cookie

        # The cookie is a read pass: it never authorizes a write (sent by hand: a browser
        # keeps it to /ui, and it must not count anywhere else either) ...
        cookie_only = {"Cookie": f"{SESSION_COOKIE}={TOKEN}"}
        async with _client(server) as bare:
            read = await bare.get("/experiments/x/status", headers=cookie_only)
            assert read.status_code == 404  # a GET with the cookie passes the guard
            post = await bare.post("/experiments", json={"name": "x"}, headers=cookie_only)
            assert post.status_code == 401
        # ... nor a request another site's page makes the browser send.
        foreign = await web.get("/ui/", headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        # The form's media type is accepted on the login path only.
        form = await web.post("/experiments", data={"name": "x"}, headers=BEARER)
        assert form.status_code == 415

        # Logging out clears the cookie: the next page asks to log in again.
        assert (await web.get("/ui/logout")).status_code == 303
        assert (await web.get("/ui/")).status_code == 303


async def test_pages_escape_every_value_and_show_the_api_numbers(
    server: str, ledger: MongoLedger
) -> None:
    exp = "dash-escape"
    await _seed(ledger, exp, EVIL_NAME, n_trials=8, n_records=8)
    await _seed(ledger, "dash-other", "other experiment", n_trials=4, n_records=2)
    async with _client(server, headers=BEARER) as web:
        pages = [
            await web.get("/ui/"),
            await web.get(f"/ui/experiments/{exp}"),
            await web.get(f"/ui/trials/{exp}-trial-4"),  # the unscored one
        ]
        for page in pages:
            _assert_secure_page(page)
            for raw in ("<script>alert", "<img src=x", "<b>bold", "<i>verifier", "<script>err"):
                assert raw not in page.text
        listing, experiment, trial = (p.text for p in pages)
        # Negative control: the values are there, as text.
        assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in listing
        assert "&lt;script&gt;alert(&#39;task&#39;)&lt;/script&gt;" in experiment
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in experiment
        assert "&lt;script&gt;err&lt;/script&gt; in result.json" in trial
        assert "ada (t1)" in listing and "complete" in listing and "running" in listing

        # The leaderboard shows the JSON API's numbers, worded as the CLI words them.
        rows = (await web.get(f"/experiments/{exp}/leaderboard")).json()
        assert rows and rows[0]["n_scored"] == 7
        for row in rows:
            for text in leaderboard_cells(row).values():
                assert _escaped(text) in experiment, text
        assert "0.714 [" in experiment  # 5 of 7 scored trials passed

        # The trials as the page links them: JSON, and a JUnit report that parses
        # whatever the names hold.
        assert f'href="/experiments/{exp}/trials.xml"' in experiment
        listed = (await web.get(f"/experiments/{exp}/trials")).json()
        junit = await web.get(f"/experiments/{exp}/trials.xml")
        cases = list(ET.fromstring(junit.content).iter("testcase"))
        assert len(cases) == len(listed) == 8
        assert {c.get("name", "").rsplit(" #", 1)[0] for c in cases} == {t["task"] for t in listed}

        # The filter box: by name, by state, and nothing.
        assert "dash-other" not in (await web.get("/ui/", params={"q": "BOLD"})).text
        assert exp in (await web.get("/ui/", params={"q": "BOLD"})).text
        running = (await web.get("/ui/", params={"q": "running"})).text
        assert "dash-other" in running and exp not in running
        assert "No experiment matches" in (await web.get("/ui/", params={"q": "zzz"})).text

        # Ids that could widen a subscription are refused before anything subscribes.
        for bad in ("a*", "a>", "a.b"):
            assert (await web.get(f"/ui/experiments/{bad}/events")).status_code == 404
        assert (await web.get("/ui/trials/a*/log")).status_code == 404
        assert (await web.get("/ui/static/../app.py")).status_code == 404
        assert (await web.get("/ui/experiments/nope")).status_code == 404


def _escaped(text: str) -> str:
    return str(markupsafe.escape(text))  # as the templates escape


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, object]]]:
    """(event name, data) of an SSE response, as they arrive."""
    name, data = "", ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "" and name:
            yield name, json.loads(data)
            name, data = "", ""


def _counts(progress: object) -> dict[str, object]:
    assert isinstance(progress, dict)
    return {k: v for k, v in progress.items() if k not in ("started", "duration")}


async def test_experiment_page_stream_pushes_its_own_events(
    server: str, ledger: MongoLedger, nats_url: str, topology: Topology
) -> None:
    exp, other = "dash-live", "dash-live-other"
    await _seed(ledger, exp, "live", n_trials=3, n_records=1)
    nc = await nats.connect(nats_url)
    bus = JetStreamBus(nc.jetstream(), topology)
    try:
        async with (
            _client(server, headers=BEARER) as web,
            web.stream("GET", f"/ui/experiments/{exp}/events") as response,
        ):
            assert response.headers["content-type"].startswith("text/event-stream")
            events = _events(response)
            name, first = await anext(events)
            assert name == "progress"
            assert first["progress"]["started"] == "2026-11-26 07:00:00Z"  # type: ignore[index]
            assert _counts(first["progress"]) == {
                "total": 3, "done": 1, "running": 0, "queued": 2, "scored": 1,
                "unscored": 0, "state": "running",
            }  # fmt: skip
            started = TrialStarted(
                experiment_id=exp, trial_id=f"{exp}-trial-1", runner_id="r", host="h", attempt=1
            )
            # Another experiment's event first: it must not reach this stream.
            await bus.publish(ResultImported(
                experiment_id=other, trial_id="x-1", status="complete", scored=True, changed=True
            ))  # fmt: skip
            await bus.publish(started)
            await ledger.upsert_records([_record(exp, 2, 1.0, "t", "a")])
            await bus.publish(ResultImported(
                experiment_id=exp, trial_id=f"{exp}-trial-2", status="complete", scored=True,
                main_reward=1.0, changed=True,
            ))  # fmt: skip
            seen: list[str] = []
            async with asyncio.timeout(DEADLINE_S):
                async for name, data in events:
                    if name == "trial":
                        seen.append(str(data["trial_id"]))
                        assert data["trial_id"] != "x-1"
                    elif _counts(data["progress"]) == {
                        "total": 3, "done": 2, "running": 1, "queued": 0, "scored": 2,
                        "unscored": 0, "state": "running",
                    }:  # fmt: skip
                        html = data["sections"]["trials"]  # type: ignore[index]
                        assert f"{exp}-trial-1" in html and "running" in html
                        break
            assert seen[:2] == [f"{exp}-trial-1", f"{exp}-trial-2"]
    finally:
        await nc.close()


async def test_trial_log_stream_sends_that_trial_s_lines(
    server: str, nats_url: str, topology: Topology
) -> None:
    exp, trial, other = "dash-log", "dash-log-trial-1", "dash-log-trial-2"
    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def line(trial_id: str, text: str) -> None:
        ev = TrialLog(
            experiment_id=exp, trial_id=trial_id, phase="agent", stream="stdout", text=text
        )
        await js.publish(topology.log_subject(exp, trial_id), encode_event(ev))

    try:
        async with _client(server, headers=BEARER) as web:
            page = await web.get(f"/ui/trials/{trial}")  # no record yet: the live log only
            _assert_secure_page(page)
            assert "No record yet" in page.text and f"/ui/trials/{trial}/log" in page.text
            await line(trial, "before <b>connect</b>\n")  # the stream replays what is held
            await line(other, "not this trial\n")
            async with web.stream("GET", f"/ui/trials/{trial}/log") as response:
                events = _events(response)
                await line(trial, "after connect\n")
                texts: list[str] = []
                async with asyncio.timeout(DEADLINE_S):
                    async for name, data in events:
                        assert name == "log"
                        texts.append(str(data["text"]))
                        if len(texts) == 2:
                            break
                assert texts == ["before <b>connect</b>\n", "after connect\n"]
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def test_a_paused_experiment_is_shown_paused(
    server: str, ledger: MongoLedger, nats_url: str, topology: Topology
) -> None:
    exp = "dash-paused"
    await _seed(ledger, exp, "paused experiment", n_trials=4, n_records=1)
    await _seed(ledger, "dash-control", "control experiment", n_trials=4, n_records=1)
    nc = await nats.connect(nats_url)
    try:
        coordinator = await NatsCoordinator.open(nc.jetstream(), topology, lease_ttl_s=60)
        await coordinator.pause(exp)
        async with _client(server, headers=BEARER) as web:
            paused = (await web.get("/ui/", params={"q": "paused"})).text
            # Negative control: the other incomplete experiment is running, not paused.
            assert exp in paused and "dash-control" not in paused
            assert 'class="state state-paused"' in paused
            page = await web.get(f"/ui/experiments/{exp}")
            assert "state-paused" in page.text
            await coordinator.resume(exp)
            # The server answers from its one-second flag cache: it shows the resume
            # within a second or so (no event tells when; the deadline is generous).
            async with asyncio.timeout(DEADLINE_S):
                while exp not in (await web.get("/ui/", params={"q": "running"})).text:  # noqa: ASYNC110
                    await asyncio.sleep(0.2)
    finally:
        await nc.close()
