"""The Prometheus endpoints, scraped against the real thing.

- importer: its own process (tests/support/importer_process.py) on the session's
  nats-server and ledger, with TRIALBUS_METRICS_PORT set; a valid event, a final
  TrialFailed (a record) and a poison message move its counters, which read zero first.
- watcher: its app in this process (lifespan via TestApp) on the same servers.
- submitter: GET /metrics on the HTTP API, behind the API's bearer token.
- a durable's pending count, read from the server (0, then 3 waiting events).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import nats
import pytest
from fastapi.testclient import TestClient
from faststream import TestApp
from prometheus_client.parser import text_string_to_metric_families

from infra.managed_process import free_port
from infra.service_process import ServiceProcess
from schemas.events import ExperimentSubmitted, TrialFailed, encode_event
from schemas.subjects import Topology
from services.common.settings import SubmitterSettings, WatcherSettings
from services.submitter.api_tokens import issue_token
from services.submitter.app import create_app as submitter_app
from services.watcher.app import create_app as watcher_app
from tests.support import importer_process
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

importer = importer_process.importer
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def importer_env(metrics_port: int) -> dict[str, str]:
    return {"TRIALBUS_METRICS_PORT": str(metrics_port)}


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def scrape(port: int) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    response.raise_for_status()
    return response.text


async def until_scraped(
    port: int, what: str, check: Callable[[str], bool], alive: Callable[[], bool]
) -> str:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = await scrape(port)
        if check(text):
            return text
        assert alive(), f"the service died waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{text[-3000:]}"
        await asyncio.sleep(0.2)


async def _publish(nats_url: str, topology: Topology, experiment: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        submitted = ExperimentSubmitted(
            experiment_id=experiment, name="m", n_trials=1, n_published=0, manifest={}
        )
        failed = TrialFailed(
            experiment_id=experiment, trial_id=f"{experiment}-t1", failure_class="agent",
            error_type="AgentError", message="no", attempt=1, final=True,
        )  # fmt: skip
        for event in (submitted, failed):
            await js.publish(topology.event_subject(event.type, experiment), encode_event(event))
        await js.publish(topology.event_subject("trial_failed", experiment), b"not json")
    finally:
        await nc.close()


async def test_importer_process_exports_its_counters(
    importer: ServiceProcess, metrics_port: int, nats_url: str, topology: Topology
) -> None:
    before = await until_scraped(
        metrics_port,
        "the exporter",
        lambda t: "trialbus_events_consumed" in t,
        lambda: importer.alive,
    )
    svc = {"service": "importer"}
    assert sample(before, "trialbus_events_consumed_total", **svc) == 0
    assert sample(before, "trialbus_records_written_total", **svc) == 0
    await _publish(nats_url, topology, "metrics-exp")

    def settled(text: str) -> bool:
        return sample(text, "trialbus_events_settled_total", **svc) >= 3

    after = await until_scraped(metrics_port, "three settled", settled, lambda: importer.alive)
    # The three published, and perhaps already the importer's own ResultImported (it
    # consumes the events stream it announces on, acking them): at least 3.
    consumed = sample(after, "trialbus_events_consumed_total", **svc)
    assert consumed >= 3
    assert sample(after, "trialbus_events_settled_total", action="ack", **svc) >= 2
    assert sample(after, "trialbus_events_settled_total", action="term", reason="poison") == 1
    assert sample(after, "trialbus_events_settled_total", action="nak", **svc) == 0
    assert sample(after, "trialbus_batch_size_count", **svc) >= 1
    # The same three, plus perhaps that ResultImported (one record is written).
    assert sample(after, "trialbus_batch_size_sum", **svc) in (3, 4)
    assert sample(after, "trialbus_ledger_write_duration_seconds_count", op="upsert_records") >= 1
    assert (
        sample(after, "trialbus_ledger_write_duration_seconds_count", op="upsert_experiment") >= 1
    )
    assert sample(after, "trialbus_records_written_total", outcome="inserted", **svc) == 1
    durable = {"durable": topology.importer_durable}
    ready = await until_scraped(
        metrics_port,
        "the consumer's counts",
        lambda t: "trialbus_consumer_pending{" in t,
        lambda: importer.alive,
    )
    assert sample(ready, "trialbus_consumer_pending", state="ack_pending", **durable) == 0
    # FastStream's own middleware counts the batches it handed over.
    assert sample(after, "trialbus_faststream_received_messages_total", app_name="importer") >= 1


async def test_watcher_app_exports_its_counters(
    tmp_path: Path, servers: Servers, nats_url: str, topology: Topology
) -> None:
    port = free_port()
    settings = servers.settings(
        WatcherSettings, jobs_dir=tmp_path / "jobs", watch_external=False, metrics_port=port
    )
    async with TestApp(watcher_app(settings)):
        before = await scrape(port)
        assert sample(before, "trialbus_events_consumed_total", service="watcher") == 0
        await _publish(nats_url, topology, "watched-exp")
        after = await until_scraped(
            port,
            "three consumed",
            lambda t: sample(t, "trialbus_events_settled_total", service="watcher") >= 3,
            lambda: True,
        )
    assert sample(after, "trialbus_events_consumed_total", service="watcher") == 3
    assert sample(after, "trialbus_events_settled_total", action="term", service="watcher") == 1
    with pytest.raises(httpx.ConnectError):  # the exporter stops with the app
        await scrape(port)


def test_submitter_serves_metrics_behind_its_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = issue_token(tokens, user="ops", team=None, admin=False)
    app = submitter_app(SubmitterSettings(api_tokens_file=tokens))
    client = TestClient(app, base_url="http://127.0.0.1")
    assert client.get("/metrics").status_code == 401  # control: no token, no metrics
    auth = {"Authorization": f"Bearer {token}"}
    first = client.get("/metrics", headers=auth)
    assert first.status_code == 200
    assert first.headers["content-type"].startswith("text/plain")
    health = {"method": "GET", "route": "/healthz", "status": "200"}
    assert sample(first.text, "trialbus_http_requests_total", **health) == 0
    assert client.get("/healthz").status_code == 200
    second = client.get("/metrics", headers=auth).text
    assert sample(second, "trialbus_http_requests_total", **health) == 1
    assert sample(second, "trialbus_http_request_duration_seconds_count", **health) == 1


async def test_consumer_counts_are_the_servers(nats_url: str, topology: Topology) -> None:
    """poll_consumer reads a durable's pending count: 0, then 3 once three events wait."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from services.common.adapters.jetstream import ensure_streams
    from services.common.metrics import ServiceMetrics

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, topology, 1)
        durable = f"{topology.prefix}-idle"
        await js.add_consumer(
            topology.events_stream,
            ConsumerConfig(
                durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                filter_subject=topology.event_filter("*", "idle-exp"),
            ),
        )  # fmt: skip
        m = ServiceMetrics("test")
        gauge = ("trialbus_consumer_pending", {"durable": durable, "state": "pending"})
        await m.poll_consumer(js, topology.events_stream, durable)
        assert m.registry.get_sample_value(*gauge) == 0
        await _publish(nats_url, topology, "idle-exp")
        await m.poll_consumer(js, topology.events_stream, durable)
        assert m.registry.get_sample_value(*gauge) == 3
    finally:
        await nc.close()
