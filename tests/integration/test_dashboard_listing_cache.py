"""The trial page lists a stored folder once per archive digest, not once per view:
served by a real uvicorn on the real nats-server (the results bucket) and ledger.

Shown by removing the object from the bucket after the first view: the page of the
same app still lists its files (from the listing kept under the record's sha256),
while the download, which needs the bytes, is a 404 naming the bucket. Controls: a
fresh app (an empty cache) says the archive is gone; another trial, with another
archive, lists its own files.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import nats
import pytest

from schemas.objects import ObjectRef
from schemas.record import Artifacts, Evaluation, Provenance, TrialRecord
from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.adapters.nats_objects import open_bucket
from services.common.archive import pack_trial
from services.submitter.http_security import SESSION_COOKIE
from tests.support.dashboard_site import served_api
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKEN = "listing-token-1b6453892473a4"
DEADLINE_S = 60.0


def _record(trial: str, archive: ObjectRef) -> TrialRecord:
    return TrialRecord(
        trial_id=trial,
        experiment_id="cached",
        status="complete",
        provenance=Provenance(task_name="hello", agent_name="oracle"),
        evaluation=Evaluation(
            rewards={"reward": 1.0}, main_reward_key="reward", main_reward=1.0, reward_valid=True
        ),
        artifacts=Artifacts(archive=archive),
    )


def _listed(page: str) -> set[str]:
    """The file names the trial page lists (each a download link)."""
    return set(re.findall(r'href="/ui/experiments/cached/trials/[^/"]+/files/([^"]+)"', page))


async def test_a_listing_is_kept_by_digest(
    tmp_path: Path, servers: Servers, topology: Topology
) -> None:
    settings = servers.site_settings(TOKEN)
    nc = await nats.connect(servers.nats_url)
    ledger = servers.ledger()
    try:
        await ensure_streams(nc.jetstream(), topology)
        store = await open_bucket(nc.jetstream(), settings, "results")
        refs = {}
        for trial, files in (("cached-t1", ("a.txt", "b/c.txt")), ("cached-t2", ("z.txt",))):
            folder = tmp_path / trial
            for rel in files:
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_text(f"{trial}:{rel}")
            refs[trial] = await store.put(f"cached/{trial}/1.tar.gz", pack_trial(folder).data)
        await ledger.upsert_records([_record(t, ref) for t, ref in refs.items()])
        cookies = {SESSION_COOKIE: TOKEN}

        async with (
            served_api(settings) as base,
            httpx.AsyncClient(base_url=base, timeout=DEADLINE_S, cookies=cookies) as web,
        ):
            first = (await web.get("/ui/trials/cached-t1")).text
            assert {"a.txt", "b/c.txt"} <= _listed(first)
            await store.delete(refs["cached-t1"].name)
            again = (await web.get("/ui/trials/cached-t1")).text
            assert _listed(again) == _listed(first)  # listed without the object
            assert "no longer in bucket" not in again
            # The bytes themselves are gone: the download says so.
            gone = await web.get("/ui/experiments/cached/trials/cached-t1/files/a.txt")
            assert gone.status_code == 404 and "no longer in bucket" in gone.text
            # Control: another trial's archive is listed from its own bytes.
            other = (await web.get("/ui/trials/cached-t2")).text
            assert "z.txt" in _listed(other) and "a.txt" not in _listed(other)

        # Control: a fresh app has no listing kept, and finds the archive gone.
        async with (
            served_api(settings) as base,
            httpx.AsyncClient(base_url=base, timeout=DEADLINE_S, cookies=cookies) as web,
        ):
            fresh = (await web.get("/ui/trials/cached-t1")).text
            assert _listed(fresh) == set() and "no longer in bucket" in fresh
    finally:
        await ledger.close()
        await nc.close()
