"""RunnerMetrics counts what a runner publishes, once, and exports it over HTTP."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from schemas.events import TrialCompleted, TrialStarted
from schemas.objects import ObjectRef
from schemas.runners import RunnerLoad
from services.common.adapters.memory import RecordingBus
from services.common.errors import ACK, Settle
from services.common.runner_metrics import RunnerMetrics, exporter
from tests.support.event_builders import trial_failed


def value(m: RunnerMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_trials_started_completed_failed_and_durations() -> None:
    m = RunnerMetrics()
    bus = m.bus(RecordingBus())
    started = TrialStarted(experiment_id="e", trial_id="t1", runner_id="r", host="h", attempt=1)
    assert value(m, "trialbus_trials_total", event="started", failure_class="", final="") == 0
    await bus.publish(started)
    await bus.publish(started)  # a duplicate (same dedup id): not a second start
    stored = ObjectRef(bucket="RESULTS", name="e/t1/1.tar.gz", size=1, sha256="ab" * 32)
    done = TrialCompleted(
        experiment_id="e", trial_id="t1", attempt=1, result=stored, trial_name="t1"
    )
    failed = trial_failed("t2", failure_class="agent", attempt=2, final=True)
    await bus.publish_many([done, failed])
    assert value(m, "trialbus_trials_total", event="started", failure_class="", final="") == 1
    assert value(m, "trialbus_trials_total", event="completed", failure_class="", final="") == 1
    assert (
        value(m, "trialbus_trials_total", event="failed", failure_class="agent", final="true") == 1
    )
    # Timed from its start: t1 only (t2's start was never seen here).
    assert value(m, "trialbus_trial_duration_seconds_count", outcome="completed") == 1
    assert value(m, "trialbus_trial_duration_seconds_count", outcome="failed") == 0


async def test_in_flight_and_verdicts() -> None:
    m = RunnerMetrics()
    seen: list[float] = []

    async def handle(data: bytes, keep_alive: object, *, subject: str = "") -> Settle:
        seen.append(value(m, "trialbus_trials_in_flight"))
        return ACK

    async def beat() -> None:
        pass

    await m.handler(handle)(b"x", beat)
    assert seen == [1.0]
    assert value(m, "trialbus_trials_in_flight") == 0
    assert (
        value(m, "trialbus_events_settled_total", service="runner", action="ack", reason="done")
        == 1
    )


def test_exporter_serves_the_registry_and_stops() -> None:
    m = RunnerMetrics()
    with exporter(m.registry, None) as nothing:
        assert nothing is None
    with exporter(m.registry, 0) as port:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"trialbus_trials", "trialbus_trials_in_flight"} <= names


async def test_the_heartbeat_load_counts_what_the_metrics_count() -> None:
    # The fleet view's in flight / done / failed (RunnerInfo via heartbeat) come from
    # the same events and handler as the Prometheus counters.
    m = RunnerMetrics()
    bus = m.bus(RecordingBus())
    loads: list[RunnerLoad] = []

    async def handle(data: bytes, keep_alive: object, *, subject: str = "") -> Settle:
        loads.append(m.load())
        return ACK

    async def beat() -> None:
        pass

    assert m.load() == RunnerLoad(in_flight=0, done=0, failed=0)
    await m.handler(handle)(b"x", beat)
    assert loads == [RunnerLoad(in_flight=1, done=0, failed=0)]
    stored = ObjectRef(bucket="RESULTS", name="e/t1/1.tar.gz", size=1, sha256="ab" * 32)
    done = TrialCompleted(
        experiment_id="e", trial_id="t1", attempt=1, result=stored, trial_name="t1"
    )
    retried = trial_failed("t2", experiment_id="e", attempt=1, final=False)
    await bus.publish_many([done, retried])
    await bus.publish(done)  # a duplicate: not a second attempt done
    assert m.load() == RunnerLoad(in_flight=0, done=1, failed=1)
