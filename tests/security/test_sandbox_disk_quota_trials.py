"""The disk quota through a real runner: the operator's setting, Harbor's record, the
failure class.

A real runner process (``python -m services.runner``) with
``TRIALBUS_SANDBOX_DISK_MB=64`` runs hello-file in the local environment for two
agents of the same class (tests/support/disk_agent.py): ``filler`` writes 100 MB into
its /tmp, ``modest`` (the negative control) 8 MB; both then solve the task. Asserted:
the filler's trial ends with ``DiskQuotaExceededError`` naming the 64 MB quota in
Harbor's result, is recorded as an *agent* failure, unscored, after one attempt (not
retried); the modest trial scores 1 with no exception.
"""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from infra.service_process import ServiceProcess
from schemas.events import TrialCompleted, TrialFailed, parse_event
from schemas.subjects import Topology
from services.common.adapters.nats_objects import open_bucket
from services.common.settings import RunnerSettings
from services.importer.event_records import record_for
from services.importer.folders import StoredTrials
from tests.e2e.events import stream_payloads
from tests.support.disk_agent import IMPORT_PATH, disk_writer_manifest
from tests.support.importer_process import until
from tests.support.runner_policy import StartRunner, write_policy
from tests.support.sandbox_env import needs_sandbox
from tests.support.servers import Servers

pytestmark = [pytest.mark.integration, needs_sandbox]

MANIFEST = disk_writer_manifest("disk-quota", filler={"megabytes": 100}, modest={"megabytes": 8})


@pytest.fixture
def runner(tmp_path: Path, policy_runner: StartRunner) -> ServiceProcess:
    """A runner whose trials may write 64 MB each."""
    policy = write_policy(tmp_path / "policy", agent_import_paths=[IMPORT_PATH])
    return policy_runner(policy, "disk-runner", TRIALBUS_SANDBOX_DISK_MB="64")


async def test_a_trial_past_the_runners_quota_is_an_unscored_agent_failure(
    runner: ServiceProcess,
    servers: Servers,
    topology: Topology,
    tmp_path: Path,
) -> None:
    await servers.submit_example(MANIFEST)
    nc = await nats.connect(servers.nats_url)
    try:
        js = nc.jetstream()
        ends: list[TrialCompleted | TrialFailed] = []

        async def done() -> bool:
            events = [parse_event(p) for p in await stream_payloads(js, topology.events_stream)]
            ends[:] = [e for e in events if isinstance(e, TrialCompleted | TrialFailed)]
            return len(ends) >= 2

        await until("both trials' ends", done, runner, 300)
        assert all(isinstance(e, TrialCompleted) for e in ends), ends
        store = await open_bucket(js, servers.settings(RunnerSettings), "results")
        trials = StoredTrials(store, tmp_path / "importer")
        records = {}
        for end in ends:
            assert isinstance(end, TrialCompleted)
            assert end.attempt == 1  # not retried
            records[end.agent_label] = await record_for(end, trials)
    finally:
        await nc.drain()

    filler = records["filler"].evaluation
    assert filler.exception_type == "DiskQuotaExceededError", filler
    assert "disk quota of 64 MB" in (filler.exception_message or "")
    assert filler.failure_class == "agent"
    assert not filler.reward_valid
    # Negative control: the same agent writing less, under the same runner, scores.
    modest = records["modest"].evaluation
    assert modest.exception_type is None, modest
    assert modest.reward_valid and modest.main_reward == 1.0
