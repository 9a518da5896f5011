"""The watcher redacts what it stores, publishes and logs of Harbor jobs made outside
trialbus, as a runner redacts its trials (issue 11).

A real watcher process on the session's nats-server and ledger, started with
``OPENAI_API_KEY`` (a name that says secret) and ``PLAIN_SETTING`` (one that does
not) in its environment, finds two finished external jobs:

- ``announced``: a real Harbor trial folder whose agent log quotes the key, its base64
  form and the plain value. Its stored folder (the results bucket) holds
  ``[redacted:OPENAI_API_KEY]`` where the key was, and no form of the key; the plain
  value is still there (the negative control: the folder was stored, only secrets
  were replaced). Before, the folder was stored as it was.
- a job whose folder name holds the key: not announced (its id would be made of the
  name), and the watcher's warning names it redacted.

No event on the stream and no line of the watcher's log holds the key.
"""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

import nats
import pytest
from nats.js.errors import NotFoundError

from infra.embedded_stack import stack_env
from infra.service_process import ServiceProcess
from schemas.events import TrialCompleted, parse_event
from schemas.ids import slug
from schemas.subjects import Topology
from services.common.adapters.nats_objects import open_bucket
from services.common.harbor_jobs import write_job_result
from services.common.redaction import base64_forms
from services.common.settings import WatcherSettings
from tests import harbor_fixtures
from tests.e2e.events import stream_payloads
from tests.harbor_fixtures import HarborTrials
from tests.support.importer_process import until

pytestmark = pytest.mark.integration
harbor_trials = harbor_fixtures.harbor_trials

SECRET = "sk-watcher-test-7f3a9c2e5b1d48a6"
PLAIN = "plain-value-visible-4c1e"


def _external_job(jobs: Path, name: str, trial_name: str, harbor_trials: HarborTrials) -> Path:
    job = jobs / name
    job.mkdir(parents=True)
    trial = harbor_trials.copy("oracle", job, trial_name)
    b64 = base64.b64encode(f"Bearer {SECRET}".encode()).decode()
    (trial / "agent").mkdir(exist_ok=True)
    (trial / "agent" / "leak.log").write_text(
        f"$ env | grep -i key\nOPENAI_API_KEY={SECRET}\nbasic {b64}\nPLAIN_SETTING={PLAIN}\n"
    )
    write_job_result(job, f"harbor-{slug(name)}", 1)
    return job


async def test_external_jobs_are_stored_published_and_logged_redacted(
    tmp_path: Path,
    harbor_trials: HarborTrials,
    nats_url: str,
    ledger_url: str,
    ledger_db: str,
    topology: Topology,
) -> None:
    jobs = tmp_path / "jobs"
    _external_job(jobs, "announced", "hello-file__leak", harbor_trials)
    _external_job(jobs, f"run-{SECRET}", "hello-file__named", harbor_trials)
    env = stack_env(nats_url, ledger_url, topology.prefix, ledger_db)
    env.update(
        TRIALBUS_JOBS_DIR=str(jobs),
        TRIALBUS_WORK_DIR=str(tmp_path / "work"),
        TRIALBUS_SCAN_INTERVAL_S="0.5",
        TRIALBUS_LOG_JSON="true",
        OPENAI_API_KEY=SECRET,
        PLAIN_SETTING=PLAIN,
    )
    watcher = ServiceProcess("watcher", env, tmp_path / "watcher.log")
    watcher.start()
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        ends: list[TrialCompleted] = []
        payloads: list[bytes] = []

        async def announced_and_refused() -> bool:
            try:
                payloads[:] = await stream_payloads(js, topology.events_stream)
            except NotFoundError:
                return False  # the watcher has not made the streams yet
            events = [parse_event(p) for p in payloads]
            ends[:] = [e for e in events if isinstance(e, TrialCompleted)]
            refused = "not announced" in watcher.log_path.read_text()
            return bool(ends) and (refused or len(ends) > 1)

        await until("the external jobs' scan", announced_and_refused, watcher, 120)
        end = next(e for e in ends if e.experiment_id == "harbor-announced")
        store = await open_bucket(
            js, WatcherSettings(nats_url=nats_url, prefix=topology.prefix), "results"
        )
        archive = await store.get(end.result)
    finally:
        await nc.drain()
        watcher.stop()

    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("agent/leak.log"))
        extracted = tar.extractfile(member)
        assert extracted is not None
        leak_log = extracted.read().decode()
    assert "OPENAI_API_KEY=[redacted:OPENAI_API_KEY]" in leak_log
    assert "basic " in leak_log and "[redacted:OPENAI_API_KEY]" in leak_log.split("basic ")[1]
    assert SECRET not in leak_log
    assert not [form for form in base64_forms(SECRET) if form in leak_log]
    assert SECRET.encode() not in _all_member_bytes(archive)
    # Negative control: what is not a secret was stored as it was.
    assert f"PLAIN_SETTING={PLAIN}" in leak_log
    # Nothing published, nothing logged, holds the key; the secret-named job is refused.
    assert [e.experiment_id for e in ends] == ["harbor-announced"]
    assert not any(SECRET.encode() in p for p in payloads)
    log = watcher.log_path.read_text()
    assert SECRET not in log
    assert "run-[redacted:OPENAI_API_KEY]" in log


def _all_member_bytes(archive: bytes) -> bytes:
    """Every file's bytes in the stored archive, concatenated (the gzip undone)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None:
                out.write(f.read())
    return out.getvalue()
