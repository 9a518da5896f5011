"""A real Harbor trial whose agent prints its secrets: the logs stream stays clean.

tests/support/live_log_trial.py runs, as its own process with secrets in its
environment (as a runner has them), one Harbor trial of tests/support/leak_agent.py on
hello-file in the local environment; Harbor's live output goes through the runner's
sinks (built from RunnerSettings) to the session's nats-server. The agent prints the
variables its ``api_key_env`` names, one of them in base64, and the runner's ledger
password, which its own code read from the process environment.

Control: the raw output Harbor handed to the sink held every one of those values, so
the test fails if redaction stops working (before it, they all reached the stream).
"""

from __future__ import annotations

import base64
from pathlib import Path

import nats
import pytest

from schemas.events import TrialLog, parse_event
from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams
from tests.integration.test_live_logs_nats import stored
from tests.support.live_log_trial import TRIAL_ID
from tests.support.secret_trials import LEDGER_PASSWORD, SECRETS, run_with_secrets

pytestmark = pytest.mark.integration


async def test_a_harbor_agent_printing_its_secrets_leaves_the_logs_stream_clean(
    nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js, topology)
    await run_with_secrets(
        "tests.support.live_log_trial", nats_url, topology.prefix, tmp_path, timeout_s=240
    )

    values = [*SECRETS.values(), LEDGER_PASSWORD]
    encoded = base64.b64encode(SECRETS["OPENAI_API_KEY"].encode()).decode()
    raw = (tmp_path / "raw.txt").read_text()
    for value in [*values, encoded]:
        assert value in raw, f"control: the agent's output lacks {value!r}: {raw!r}"

    n = int((tmp_path / "published.txt").read_text())
    try:
        payloads = await stored(js, topology, TRIAL_ID, n=n, experiment_id="exp-leak")
    finally:
        await nc.drain()
    for payload in payloads:
        for value in [*values, encoded[:16]]:
            assert value.encode() not in payload, (value, payload[:300])
    texts = [e.text for e in map(parse_event, payloads) if isinstance(e, TrialLog)]
    published = "".join(texts)
    for name in (*SECRETS, "LEDGER_URL"):
        assert f"[redacted:{name}]" in published, published
    assert "OPENAI_API_KEY=[redacted:OPENAI_API_KEY]" in published
