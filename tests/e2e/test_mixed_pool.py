"""A pool whose runners are not alike: only one of them holds the agent's API key (and
the key a task's verifier asks for in its task.toml).

Both runners take work from the pool's durable. Before, the one without the key took
its share of the trials and failed each of them (the key missing on that runner,
final and unscored), though a runner of the pool that had the key was live. Now it
hands each back (services/runner/fit.py) and the keyed runner runs them all; with no
keyed runner left, the keyless one ends them at once, saying why.

Real runner processes on the stack's NATS (the instant executor: the key is never
used), the real CLI, events read from the stream.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import nats
import pytest

from benchmarks.instant_executor import EXECUTOR_SPEC
from schemas.events import Event, TrialFailed, TrialStarted
from services.common.adapters.nats_registry import NatsRunnerRegistry
from tests.e2e.conftest import Stacks
from tests.e2e.events import read_events
from tests.support.importer_process import until
from tests.support.manifests import HELLO_FILE, manifest_file, nop_agents
from tests.support.runner_policy import start_runner, write_policy

pytestmark = pytest.mark.e2e

KEY = "ANTHROPIC_API_KEY"
JUDGE_KEY = "OPENAI_API_KEY"
"""What a task's LLM-judged verifier asks the runner for (``${OPENAI_API_KEY}``)."""
INSTANT = {"TRIALBUS_EXECUTOR": EXECUTOR_SPEC, "TRIALBUS_INSTANT_DELAY_S": "0.2"}


def keyed_manifest(folder: Path, name: str) -> Path:
    """8 trials whose agent names the key in ``api_key_env``."""
    agents = [{**a, "api_key_env": [KEY]} for a in nop_agents(4)]
    return manifest_file(
        folder, name, tasks=[HELLO_FILE], agents=agents, repetitions=2, concurrency=8
    )


def judged_manifest(folder: Path, name: str) -> Path:
    """8 trials of a task whose verifier needs ``JUDGE_KEY`` (agents need no key)."""
    task = folder / "judged-hello"
    shutil.copytree(HELLO_FILE, task)
    with (task / "task.toml").open("a") as toml:
        toml.write(f'\n[verifier.env]\nJUDGE_API_KEY = "${{{JUDGE_KEY}}}"\n')
    return manifest_file(
        folder, name, tasks=[task], agents=nop_agents(4), repetitions=2, concurrency=8
    )


def started_by(events: Sequence[Event], experiment_id: str) -> list[str]:
    """The runner id of each TrialStarted of the experiment."""
    return [
        e.runner_id
        for e in events
        if isinstance(e, TrialStarted) and e.experiment_id == experiment_id
    ]


def failures(events: Sequence[Event], experiment_id: str) -> list[TrialFailed]:
    return [e for e in events if isinstance(e, TrialFailed) and e.experiment_id == experiment_id]


async def test_a_trial_goes_to_the_runner_of_the_pool_that_has_its_key(
    stacks: Stacks, tmp_path: Path
) -> None:
    # The stack's own runner has no key ("" is none), the second runner has one.
    stack = await stacks.start(concurrency=4, runner_env={**INSTANT, KEY: "", JUDGE_KEY: ""})
    cli = stacks.cli(stack)
    nats_url = stack.nats_url or ""
    keyed = start_runner(
        tmp_path / "keyed",
        write_policy(tmp_path / "policy"),
        runner_id="keyed",
        nats_url=nats_url,
        ledger_url=stack.ledger_url or "",
        prefix=stack.prefix,
        TRIALBUS_CONCURRENCY="4",
        **INSTANT,
        **{KEY: "not-a-real-key", JUDGE_KEY: "not-a-real-key-either"},
    )
    nc = await nats.connect(nats_url)
    try:
        registry = await NatsRunnerRegistry.open(nc.jetstream(), stacks.servers.topology)

        async def keyed_live() -> bool:
            return any(r.runner_id == "keyed" for r in await registry.live_runners())

        await until("the keyed runner's registry record", keyed_live, keyed, 90)
        live = await registry.live_runners()
        assert len(live) == 2 and [r.secrets_set for r in live if r.runner_id != "keyed"] == [[]]

        done = cli.run("submit", str(keyed_manifest(tmp_path, "mixed")), "--wait", "--json")
        assert done.returncode == 0, done.stderr  # every trial scored
        first = json.loads(done.stdout)["experiment_id"]
        events = await read_events(nats_url, stacks.servers.topology)
        assert started_by(events, first) == ["keyed"] * 8
        assert failures(events, first) == []
        # The same for a key the task's task.toml asks for (the work message names it).
        judged = cli.run("submit", str(judged_manifest(tmp_path, "judged")), "--wait", "--json")
        assert judged.returncode == 0, judged.stderr
        third = json.loads(judged.stdout)["experiment_id"]
        events = await read_events(nats_url, stacks.servers.topology)
        assert started_by(events, third) == ["keyed"] * 8
        assert failures(events, third) == []

        # Control: with the keyed runner gone, the keyless one ends the trials at once,
        # saying what it lacks (submitted without the submitter's runner check, which
        # would refuse the manifest now).
        keyed.stop()

        async def keyed_gone() -> bool:
            return not await keyed_live()

        keyless = stack.services["runner-0"]  # alive throughout
        await until("the keyed runner's record withdrawn", keyed_gone, keyless, 90)
        unchecked = stacks.cli(stack, TRIALBUS_CHECK_RUNNERS="false")
        alone = unchecked.run("submit", str(keyed_manifest(tmp_path, "alone")), "--wait", "--json")
        assert alone.returncode == 1, alone.stderr  # unscored trials
        second = json.loads(alone.stdout)["experiment_id"]
        events = await read_events(nats_url, stacks.servers.topology)
        failed = failures(events, second)
        assert started_by(events, second) == [] and len(failed) == 8
        for event in failed:
            assert event.final
            assert event.error_type == "MissingSecretError"
            assert f"has no {KEY} set" in event.message
            assert "nor does any other live runner of pool 'default'" in event.message
    finally:
        await nc.close()
        keyed.stop()
