"""Local tasks end to end with the runner's ``TRIALBUS_SANDBOX_USERNS=shifted``.

The same pipeline as tests/e2e/test_local_tasks.py (real CLI, embedded stack, runner
processes), with root inside every build and trial mapped to host uid 100000: the
Dockerfile replay (apt-get from the network, pip, COPY, a python:3.12 base) and a
verifier that fetches pytest with uvx must still score 1.0 with the oracle, the
runner must read what the trial wrote, and what the build installed must be the
shifted uid's on the host (with the switch off it is host root's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.localenv.sandbox import missing_host_tools
from services.localenv.shift import DEFAULT_BASE
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.e2e.test_local_tasks import (
    assert_nothing_left,
    host_snapshot,
    layer_cache_policy,
    local_manifest,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or bool(missing_host_tools(network=True)),
        reason="needs root and bwrap/slirp4netns/util-linux (make setup)",
    ),
]

TASKS = ("dockerfile-replay", "uvx-verifier", "phase-network", "allowlist-network")
"""The network tasks too: the runner enters a shifted sandbox's namespaces to switch them."""


async def test_local_tasks_with_a_shifted_root(stacks: Stacks, tmp_path: Path) -> None:
    runner_env = {**layer_cache_policy(tmp_path), "TRIALBUS_SANDBOX_USERNS": "shifted"}
    stack = await stacks.start(concurrency=2, runner_env=runner_env)
    cli = stacks.cli(stack)
    before = host_snapshot()
    manifest = local_manifest(
        tmp_path,
        "local-tasks-shifted-root",
        TASKS,
        agents=("oracle",),
        repetitions=1,
        concurrency=2,
        retry={"max_attempts": 1},
    )
    proc = cli.run("submit", str(manifest), "--wait", "--json", timeout=600)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    summary = json.loads(proc.stdout)
    assert summary["n_trials"] == 4 and summary["status"]["recorded"] == 4

    records = await ledger_records(stack, summary["experiment_id"])
    assert sorted(r.provenance.task_name for r in records) == sorted(TASKS)
    for rec in records:
        ev = rec.evaluation
        assert (ev.main_reward, ev.failure_class) == (1.0, "none"), rec
        # The verifier wrote its reward as root inside; the runner read and stored it.
        reward = Path(rec.artifacts.trial_dir or "") / "verifier" / "reward.txt"
        assert float(reward.read_text()) == 1.0
    # The build's RUN steps ran as the shifted root: what apt-get installed into the
    # task's layer is host uid 100000's (with the switch off, host root's).
    tree = list((tmp_path / "layers").glob("*/fs/usr/bin/tree"))
    assert len(tree) == 1 and os.stat(tree[0]).st_uid == DEFAULT_BASE, tree

    assert_nothing_left(stack, before)
