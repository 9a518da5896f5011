"""A real Harbor trial whose agent prints and raises its secrets: what the runner
publishes and stores, and what the ledger records from it, holds none of them.

tests/support/redaction_trial.py runs, as its own process with secrets in its
environment (as a runner has them), the runner's TrialHandler on one work message
twice against the session's nats-server (tests.support.raising_leak_agent on
hello-file, local environment): attempt 1 fails with a retryable error whose message
quotes the secrets (a TrialFailed), attempt 2 stores the trial folder (a
TrialCompleted). The importer's ``record_for`` then builds both ledger records from
the events and the stored object.

Controls: the trial folders Harbor left on disk (kept, not rewritten) hold every value
in result.json and agent/leak.txt; the same folder stored without redaction gives a
record that quotes the secret.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nats
import pytest

from schemas.events import TrialCompleted, TrialFailed, parse_event
from schemas.subjects import Topology
from services.common.adapters.nats_objects import open_bucket
from services.common.archive import TRIAL_MANIFEST
from services.common.settings import RunnerSettings
from services.common.trial_folders import TrialFolders
from services.importer.event_records import record_for
from services.importer.folders import StoredTrials
from tests.e2e.events import stream_payloads
from tests.support.redaction_trial import TRIAL_ID
from tests.support.secret_trials import LEDGER_PASSWORD, SECRETS, run_with_secrets
from tests.support.stored_results import file_members

pytestmark = pytest.mark.integration

KEY64 = base64.b64encode(SECRETS["OPENAI_API_KEY"].encode()).decode()
VALUES = [*SECRETS.values(), LEDGER_PASSWORD, KEY64[:16]]


def _leaks(data: bytes) -> list[str]:
    return [v for v in VALUES if v.encode() in data]


async def test_a_trial_quoting_its_secrets_is_published_stored_and_recorded_redacted(
    nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    await run_with_secrets(
        "tests.support.redaction_trial", nats_url, topology.prefix, tmp_path, timeout_s=300
    )
    assert (tmp_path / "verdicts.txt").read_text().split("\n") == ["nak retry", "ack done"]

    # Control: what Harbor and the agent wrote, on disk, holds every value.
    job = tmp_path / "jobs" / "exp-redaction"
    raw = (job / TRIAL_ID / "result.json").read_bytes()
    assert sorted(_leaks(raw)) == sorted(VALUES[1:]), raw[-2000:]  # MYLLM_CRED, pw, base64
    leak = (job / TRIAL_ID / "agent" / "leak.txt").read_bytes()
    assert SECRETS["OPENAI_API_KEY"].encode() in leak or KEY64[:16].encode() in leak, leak

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        payloads = await stream_payloads(js, topology.events_stream)
        events = [parse_event(p) for p in payloads]
        failed = [e for e in events if isinstance(e, TrialFailed)]
        completed = [e for e in events if isinstance(e, TrialCompleted)]
        assert len(failed) == 1 and len(completed) == 1, [e.type for e in events]
        for payload in payloads:
            assert _leaks(payload) == [], payload[:500]
        message = failed[0].message
        for name in (*SECRETS, "LEDGER_URL"):
            assert f"[redacted:{name}]" in message, message

        store = await open_bucket(
            js, RunnerSettings(nats_url=nats_url, prefix=topology.prefix), "results"
        )
        members = file_members(await store.get(completed[0].result))
        for name, blob in members.items():
            assert _leaks(blob) == [], (name, blob[:500])
        redacted = json.loads(members[TRIAL_MANIFEST])["redacted"]
        assert redacted["replacements"] >= 4 and redacted["files"] >= 2, redacted
        assert b"[redacted:MYLLM_CRED]" in members["result.json"]

        trials = StoredTrials(store, tmp_path / "importer")
        records = [await record_for(e, trials) for e in (failed[0], completed[0])]
        for record in records:
            assert _leaks(record.model_dump_json().encode()) == [], record
        assert "[redacted:MYLLM_CRED]" in records[1].model_dump_json()

        # Control: the same folder stored without redaction makes a record that
        # quotes the secret Harbor left in result.json.
        plain = await TrialFolders(store, cap_bytes=2**24).store_as(
            "control/plain.tar.gz", job / TRIAL_ID
        )
        control = completed[0].model_copy(update={"result": plain})
        record = await record_for(control, StoredTrials(store, tmp_path / "control"))
        assert SECRETS["MYLLM_CRED"] in record.model_dump_json()
    finally:
        await nc.drain()
