"""Live logs on a real nats-server: what reaches the logs stream is redacted and bounded.

The runner's sinks (services.runner.live_logs, built as the runner's composition root
builds them, from RunnerSettings) publish with core NATS into the session
nats-server's logs stream; the test reads the stream back and checks every stored
message: no secret value (nor its base64 form) in any payload, the per-trial byte cap
held, and the dropped count published last. Negative control: the same output from a
trial whose agent does not name the secret reaches the stream in clear.

A second test runs a real trial process (services.runner.isolation, forkserver child)
and checks that the end of its output closes the sink, which then releases what
redaction kept back.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from schemas.events import TrialLog, TrialRequested, parse_event
from schemas.manifest import AgentSpec
from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.settings import RunnerSettings
from services.runner.isolation import TrialProcesses
from services.runner.live_logs import CoreNatsLogSinks, TrialLogSink
from services.runner.trial_process import BARE_SANDBOX, TrialJob
from tests.support.work_requests import hello_file_request

pytestmark = pytest.mark.integration

KEY = "sk-proj-9f8e7d6c5b4a3210fedcba9876543210"
LEDGER_PASSWORD = "ledger-pw-0123456789"
CAP = 4096


def request(trial_id: str, api_key_env: list[str]) -> TrialRequested:
    """A work message for an LLM agent that names ``api_key_env``."""
    agent = AgentSpec(name="terminus-2", model="openai/gpt-x", api_key_env=api_key_env)
    return hello_file_request(trial_id, agent, experiment_id="exp-live", correlation_id="corr")


@pytest.fixture
async def bus(nats_url: str, topology: Topology) -> AsyncIterator[tuple[Client, JetStreamContext]]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js, topology)
    try:
        yield nc, js
    finally:
        await nc.drain()


def runner_settings(nats_url: str, topology: Topology) -> RunnerSettings:
    return RunnerSettings(
        nats_url=nats_url,
        ledger_url=f"mongodb://runner:{LEDGER_PASSWORD}@127.0.0.1:27017/trialbus",
        prefix=topology.prefix,
        live_log_trial_bytes=CAP,
        live_log_event_chars=500,
    )


async def stored(
    js: JetStreamContext,
    topology: Topology,
    trial_id: str,
    n: int,
    experiment_id: str = "exp-live",
) -> list[bytes]:
    """The raw payloads of the logs stream for ``trial_id``, once there are ``n``."""
    subject = topology.log_subject(experiment_id, trial_id)
    deadline = time.monotonic() + 20
    while True:
        info = await js.stream_info(topology.logs_stream, subjects_filter=subject)
        count = (info.state.subjects or {}).get(subject, 0)
        if count >= n or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert count == n, f"{count} messages on {subject}, expected {n}"
    sub = await js.pull_subscribe(subject, stream=topology.logs_stream)
    messages = await sub.fetch(n, timeout=10)
    await sub.unsubscribe()
    return [m.data for m in messages]


class CountingPublish:
    """Core NATS publish, counting what it sends (to know how many to read back)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self.count = 0

    async def __call__(self, subject: str, payload: bytes) -> None:
        self.count += 1
        await self._nc.publish(subject, payload)


async def feed_terminal(sinks: CoreNatsLogSinks, req: TrialRequested) -> TrialLogSink:
    """An agent that dumps its environment, split mid-secret, then floods its output."""
    sink = sinks(req)
    await sink("agent", "stdout", "$ env | grep -i key\nOPENAI_API_KEY=" + KEY[:13])
    await sink("agent", "stdout", KEY[13:] + "\n$ echo $LEDGER_URL | base64\n")
    ledger = f"mongodb://runner:{LEDGER_PASSWORD}@127.0.0.1:27017/trialbus"
    await sink("agent", "stdout", base64.b64encode(ledger.encode()).decode() + "\n")
    for i in range(100):
        await sink("agent", "stderr", f"step {i:03d}: " + "·" * 60 + "\n")
    await sink.close()
    return sink


def texts_of(payloads: list[bytes]) -> list[str]:
    events = [parse_event(p) for p in payloads]
    assert all(isinstance(e, TrialLog) for e in events), events
    return [e.text for e in events if isinstance(e, TrialLog)]


async def test_the_logs_stream_never_holds_a_secret_and_the_cap_holds(
    bus: tuple[Client, JetStreamContext], nats_url: str, topology: Topology
) -> None:
    nc, js = bus
    publish = CountingPublish(nc)
    # Built as the runner builds them; the trial's environment is the runner's.
    sinks = CoreNatsLogSinks.from_settings(
        publish, runner_settings(nats_url, topology), environ={"OPENAI_API_KEY": KEY}
    )
    sink = await feed_terminal(sinks, request("leaky__0", ["OPENAI_API_KEY"]))
    await nc.flush()

    assert sink.dropped_bytes > 0 and sink.published_bytes <= CAP
    payloads = await stored(js, topology, "leaky__0", n=publish.count)
    key_b64 = base64.b64encode(KEY.encode()).decode()
    for payload in payloads:
        for form in (KEY, LEDGER_PASSWORD, key_b64[:20], KEY[:13], KEY[13:]):
            assert form.encode() not in payload, (form, payload[:300])
    texts = texts_of(payloads)
    body = "".join(t for t in texts if not t.startswith("[trialbus: "))
    assert "OPENAI_API_KEY=[redacted:OPENAI_API_KEY]\n" in body
    assert "[redacted:LEDGER_URL]" in body  # inside the base64 of the whole URL
    assert len(body.encode()) == sink.published_bytes
    assert CAP - 4 < sink.published_bytes <= CAP
    assert max(len(t) for t in texts) <= 500
    assert sum(t.startswith("[trialbus: ") for t in texts) == 2
    assert texts[-1].startswith(f"[trialbus: {sink.dropped_bytes} bytes of this trial's output")


async def test_negative_control_a_secret_the_agent_does_not_name_goes_out_in_clear(
    bus: tuple[Client, JetStreamContext], nats_url: str, topology: Topology
) -> None:
    nc, js = bus
    publish = CountingPublish(nc)
    settings = runner_settings(nats_url, topology).model_copy(
        update={"live_log_trial_bytes": 1 << 20}
    )
    sinks = CoreNatsLogSinks.from_settings(publish, settings, environ={"OPENAI_API_KEY": KEY})
    sink = await feed_terminal(sinks, request("clear__0", []))
    await nc.flush()
    payloads = await stored(js, topology, "clear__0", n=publish.count)
    assert sink.dropped_bytes == 0
    texts = texts_of(payloads)
    assert f"OPENAI_API_KEY={KEY}\n" in "".join(texts)  # what every trial did before
    assert not any(t.startswith("[trialbus: ") for t in texts)


async def test_the_end_of_a_trial_process_closes_its_sink(
    bus: tuple[Client, JetStreamContext], nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    nc, js = bus
    publish = CountingPublish(nc)
    sinks = CoreNatsLogSinks.from_settings(
        publish, runner_settings(nats_url, topology), environ={"OPENAI_API_KEY": KEY}
    )
    req = request("closed__0", ["OPENAI_API_KEY"])
    sink = sinks(req)
    await sink("agent", "stdout", "the last line ends with sk-")
    assert publish.count == 1  # "sk-" may begin the key: kept back
    # A real trial process (forkserver child) whose job cannot even be decoded: it
    # reports a failure and its pipe ends, which must close the sink.
    known: dict[str, Any] = {
        "request_json": "{}",
        "attempt": 1,
        "live_logs": True,
        "sandbox": BARE_SANDBOX,
    }
    # Other fields (folders) are never reached: the child fails decoding the request.
    job = TrialJob(**{f.name: known.get(f.name, str(tmp_path)) for f in fields(TrialJob)})
    outcome = await TrialProcesses(cancel_grace_s=5).run(job, sink)
    assert outcome["kind"] == "failed"
    await nc.flush()
    texts = texts_of(await stored(js, topology, "closed__0", n=2))
    assert texts == ["the last line ends with ", "sk-"]
