"""A runner process hides its own files from the trials it runs (local environment).

A real runner process (``python -m services.runner`` under a policy file) on the
session's nats-server, set up as an operator following the FHS would: its work
folder (trial folders of every experiment, the task cache) and a ``trialbus up``-like
data folder (every role's NATS credentials, the ledger's files) under /var, here
/var/tmp, which every trial's /var overlay shows. ``TRIALBUS_SANDBOX_HIDE`` names the
data folder (``trialbus up`` sets it to its own); the work folder and the policy
file the runner hides by itself (``RunnerSettings.hidden_from_trials``).

One real trial (hello-file, local environment) runs the reach probe
(tests/support/reach_agent.py), which prints every line of every file it can read
below the planted folder from inside its sandbox; its output is read back from the
stored trial folder. Before the fix it read all of them (checked with the hiding
disabled: this test then fails, listing the credentials, the ledger file, the other
trial's output and the policy). Control: a planted folder nobody hides is read.
"""

from __future__ import annotations

import json
import secrets
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from schemas.events import TrialCompleted, parse_event
from schemas.subjects import Topology
from services.common.adapters.nats_objects import open_bucket
from services.common.settings import RunnerSettings
from tests.e2e.events import stream_payloads
from tests.support.importer_process import until
from tests.support.runner_policy import StartRunner, write_policy
from tests.support.sandbox_env import needs_sandbox
from tests.support.servers import Servers
from tests.support.stored_results import file_members

pytestmark = [pytest.mark.integration, needs_sandbox]

AGENT = "tests.support.reach_agent:ReachAgent"


@pytest.fixture
def planted() -> Iterator[tuple[Path, str]]:
    """A folder under /var/tmp for the runner's files, and the token they hold."""
    root = Path("/var/tmp") / f"trialbus-sec-{uuid.uuid4().hex[:12]}"
    token = f"runner-file-{secrets.token_hex(8)}"
    for rel in (
        "data/nats-auth/runner.creds",
        "data/ledger/collection-0.wt",
        "work/jobs/other-exp/other-trial/agent/out.txt",
        "visible/marker.txt",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        (root / rel).write_text(f"{token}\n")
    (root / "data" / "nats-auth" / "runner.creds").chmod(0o600)
    try:
        yield root, token
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_trial_reads_none_of_its_runners_files(
    planted: tuple[Path, str],
    policy_runner: StartRunner,
    tmp_path: Path,
    servers: Servers,
    topology: Topology,
) -> None:
    root, token = planted
    policy = write_policy(root / "policy", agent_import_paths=[AGENT])
    runner = policy_runner(
        policy,
        "reach-runner",
        TRIALBUS_WORK_DIR=str(root / "work"),
        # Sandboxes cannot live under /var (overlayfs refuses an upper folder inside
        # its lower one): the runner's scratch stays in the test's folder.
        TRIALBUS_SANDBOX_DIR=str(tmp_path / "sandboxes"),
        TRIALBUS_SANDBOX_HIDE=json.dumps([str(root / "data")]),
    )
    manifest = (
        "name: reach-probe\ntasks: [hello-file]\n"
        f"agents:\n  - import_path: {AGENT}\n    kwargs: {{probe_root: {root}}}\n"
        "compute:\n  environment: local\n"
    )
    await servers.submit_example(manifest)
    nc = await nats.connect(servers.nats_url)
    try:
        js = nc.jetstream()
        completed: list[TrialCompleted] = []

        async def done() -> bool:
            events = [parse_event(p) for p in await stream_payloads(js, topology.events_stream)]
            completed[:] = [e for e in events if isinstance(e, TrialCompleted)]
            return bool(completed)

        await until("the probe's trial", done, runner, 240)
        store = await open_bucket(js, servers.settings(RunnerSettings), "results")
        members = file_members(await store.get(completed[0].result))
    finally:
        await nc.drain()

    [name] = [n for n in members if n.endswith("agent/reach.txt")]
    text = members[name].decode()
    assert "== end" in text, text
    read = {
        line.split(":", 1)[0].removeprefix(f"{root}/")
        for line in text.splitlines()
        if line.startswith(f"{root}/")
    }
    # Control: the probe reads what lies there unhidden, so it would read the rest.
    assert read == {"visible/marker.txt"}, text
    assert text.count(token) == 1, text
    # The task cache (hello-file's files, unpacked by the runner) is not there either.
    assert "hello" not in text.lower(), text
    # Only the trial's own processes: no runner, no host process.
    count = int(text.split("== processes\n", 1)[1].split("\n", 1)[0])
    assert count < 20, text
