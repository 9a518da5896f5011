"""A registry dataset run end to end: ``trialbus submit`` fetches it with Harbor's own
clients from a registry of the test's own (a ``file://`` git repository), uploads its
tasks, and the runners, which never see the registry, run them (real Harbor trials in
the local environment) and the importer records them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common.task_identity import task_checksum
from tests.e2e.cli import ROOT
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.support.task_registry import task_registry

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples" / "tasks"
TASKS = {"hello-file": EXAMPLES / "hello-file", "count-words": EXAMPLES / "count-words"}


async def test_a_registry_dataset_runs_at_its_pinned_commit(stacks: Stacks, tmp_path: Path) -> None:
    registry = task_registry(tmp_path / "registry", TASKS)
    # After the pin, the repository's hello-file verifier fails every agent: a trial that
    # ran the repository's newest content instead of the pinned one would score 0.
    registry.commit_change("tasks/hello-file/tests/test.sh", "echo 0 > /logs/verifier/reward.txt\n")
    manifest = tmp_path / "dataset.yaml"
    manifest.write_text(
        "name: registry-dataset\n"
        "tasks:\n"
        "  - {dataset: mini@1.0, registry_path: registry/registry.json}\n"
        "agents: [{name: oracle}, {name: nop}]\n"
        "compute: {environment: local, n_concurrent_trials: 4}\n"
    )
    stack = await stacks.start(concurrency=4)
    cli = stacks.cli(stack, TRIALBUS_DATASET_CACHE=str(tmp_path / "cache"))
    proc = cli.run("submit", str(manifest), "--wait", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr  # every trial scored
    summary = json.loads(proc.stdout)
    assert (summary["n_trials"], summary["status"]["scored"]) == (4, 4)

    records = await ledger_records(stack, summary["experiment_id"])
    got = {(r.provenance.task_name, r.provenance.agent_name): r for r in records}
    for task, source in TASKS.items():
        for agent, reward in (("oracle", 1.0), ("nop", 0.0)):
            record = got[task, agent]
            assert record.evaluation.main_reward == reward, (task, agent)
            # The archive the runner ran is the pinned content, byte for byte.
            assert record.provenance.task_archive == task_checksum(source)

    # Submitted again (the tasks now come from the cache): the same experiment, the
    # same trials, all scored already, nothing published.
    again = cli.run("submit", str(manifest), "--json")
    assert again.returncode == 0, again.stderr
    resubmitted = json.loads(again.stdout)
    assert resubmitted["experiment_id"] == summary["experiment_id"]
    assert (resubmitted["n_published"], resubmitted["n_already_scored"]) == (0, 4)
