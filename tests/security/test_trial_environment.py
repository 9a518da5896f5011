"""A trial's process keeps only the environment it may see (runner → agent, task).

A real runner process (``python -m services.runner`` under a policy file) on the
session's nats-server, started with runner variables a trial must never see: a
``TRIALBUS_LEDGER_URL`` holding a password and an unrelated ``CLOUD_SECRET_TOKEN``.
Neither is one of the secrets the runner redacts (its ledger URL is ``LEDGER_URL``),
so redaction cannot hide a leak here: only their absence from the trial's process
does. One real trial (hello-file, local environment) runs the environment probe
agent (tests/support/environ_agent.py, an import path the policy lists), which
prints ``os.environ`` of the trial's process, its ``/proc/self/environ``, its
parent's (the forkserver's) and its sandbox's ``env`` into its live output and its
agent folder.

Asserted: neither value nor name is in the live logs, the events, the stored trial
folder or the ledger record built from it, nor anywhere in the probe's dump; the
dump shows no ``TRIALBUS_*`` / ``NATS_*`` / ``LEDGER_*`` variable. Controls: the
agent's own ``api_key_env`` variable is visible to it (its value redacted on the way
out, its sha256 as the runner has it), a name the operator lists in the policy's
``pass_env`` is visible, PATH and HOME are there, and the dump did reach each place
checked. Before the trial's environment was cut down, the probe printed both
values in clear (checked by hand with ``restrict_environ`` and
``hide_exec_environment`` disabled: this test then fails).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nats
import pytest

from infra.service_process import ServiceProcess
from schemas.events import TrialCompleted, TrialLog, parse_event
from schemas.subjects import Topology
from services.common.adapters.nats_objects import open_bucket
from services.common.settings import RunnerSettings
from services.importer.event_records import record_for
from services.importer.folders import StoredTrials
from tests.e2e.events import stream_payloads
from tests.support.environ_agent import GRANTED
from tests.support.importer_process import until
from tests.support.runner_policy import StartRunner, write_policy
from tests.support.servers import Servers
from tests.support.stored_results import file_members

pytestmark = pytest.mark.integration

AGENT = "tests.support.environ_agent:EnvironAgent"
RUNNER_ID = "environ-runner"
LEDGER_PASSWORD = "ledgerpw-5b0d1e9c7a"
CLOUD_TOKEN = "cloudtok-77e2f4a1c3"
GRANTED_VALUE = "granted-key-9f3b6c2d10"
PASSED = ("OPERATOR_PASSED", "operator-passed-4c1a")
NEVER = {"TRIALBUS_LEDGER_URL": LEDGER_PASSWORD, "CLOUD_SECRET_TOKEN": CLOUD_TOKEN}
MANIFEST = f"""\
name: environ-probe
tasks: [hello-file]
agents:
  - import_path: {AGENT}
    api_key_env: [{GRANTED}]
compute:
  environment: local
"""


def _leaks(data: bytes) -> list[str]:
    """Names and values of NEVER found in ``data``."""
    return [s for pair in NEVER.items() for s in pair if s.encode() in data]


@pytest.fixture
def runner(tmp_path: Path, policy_runner: StartRunner) -> ServiceProcess:
    """A runner process with secrets of its own in its environment, live."""
    policy = write_policy(
        tmp_path / "policy",
        agent_import_paths=[AGENT],
        extra_secret_names=[GRANTED],
        pass_env=[PASSED[0]],
    )
    return policy_runner(
        policy,
        RUNNER_ID,
        TRIALBUS_LEDGER_URL=f"mongodb://trialbus:{LEDGER_PASSWORD}@ledger.invalid:27017",
        CLOUD_SECRET_TOKEN=CLOUD_TOKEN,
        **{GRANTED: GRANTED_VALUE, PASSED[0]: PASSED[1]},
    )


async def test_a_trial_sees_only_what_it_may_of_the_runners_environment(
    runner: ServiceProcess,
    servers: Servers,
    topology: Topology,
    tmp_path: Path,
) -> None:
    experiment_id = await servers.submit_example(MANIFEST)
    nc = await nats.connect(servers.nats_url)
    try:
        js = nc.jetstream()
        completed: list[TrialCompleted] = []
        logs: list[bytes] = []

        async def done() -> bool:
            events = [parse_event(p) for p in await stream_payloads(js, topology.events_stream)]
            completed[:] = [e for e in events if isinstance(e, TrialCompleted)]
            logs[:] = await stream_payloads(js, topology.logs_stream)
            # The dump's last line reached the logs stream (the control of that channel).
            return bool(completed) and any(b"== granted" in p for p in logs)

        await until(f"{experiment_id}'s trial and its live output", done, runner, 240)
        events = await stream_payloads(js, topology.events_stream)
        store = await open_bucket(js, servers.settings(RunnerSettings), "results")
        members = file_members(await store.get(completed[0].result))
        record = await record_for(completed[0], StoredTrials(store, tmp_path / "importer"))
    finally:
        await nc.drain()

    # Nothing of the two runner variables, anywhere the trial's output goes.
    for payload in [*logs, *events]:
        assert _leaks(payload) == [], payload[:500]
    for name, blob in members.items():
        assert _leaks(blob) == [], (name, blob[:500])
    assert _leaks(record.model_dump_json().encode()) == [], record
    runner_log = runner.log_path.read_bytes()
    assert [v for v in NEVER.values() if v.encode() in runner_log] == []

    # The dump as stored: the trial process's variables, its block, its parent's block.
    [dump_name] = [n for n in members if n.endswith("agent/environ.txt")]
    dump = members[dump_name].decode()
    lines = dump.splitlines()
    assert "== /proc/parent/environ" in lines and "== sandbox env" in lines, dump[:2000]
    own = {ln.split("=", 1)[0] for ln in lines if "=" in ln and not ln.startswith("==")}
    assert not {n for n in own if n.startswith(("TRIALBUS_", "NATS_", "LEDGER_"))}, own
    # Controls: what the trial may see, it sees.
    assert "PATH" in own and "HOME" in own, own
    assert f"{PASSED[0]}={PASSED[1]}" in lines, dump[:2000]
    assert f"{GRANTED}=[redacted:{GRANTED}]" in lines, dump[:2000]
    digest = hashlib.sha256(GRANTED_VALUE.encode()).hexdigest()
    assert f"== granted {GRANTED} sha256={digest}" in lines, dump[:2000]
    texts = "".join(e.text for e in map(parse_event, logs) if isinstance(e, TrialLog))
    assert f"[redacted:{GRANTED}]" in texts and f"{PASSED[0]}={PASSED[1]}" in texts
