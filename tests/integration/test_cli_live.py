"""The CLI's live views as processes, against the session's real nats-server and ledger.

The test plays the runner and the importer by hand (TrialStarted and TrialLog events
on the bus, records in the ledger, ResultImported events), so each step is under
its control and nothing waits on a sleep: ``trialbus experiments`` shows running and
queued as the dashboard computes them; ``status --follow`` ends exactly when the last
record arrives (and not before); ``logs`` prints one trial's lines only, and ``-f``
ends with the trial's record; ``attach`` shows the progress and its trials' new lines
(not another experiment's) and ends with the last record, exit 0 when all scored;
``runners`` marks a runner that missed its heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from schemas.events import TrialFailed, TrialLog, TrialStarted
from schemas.record import Evaluation, PhaseTiming, Provenance, TrialRecord
from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.ports import ExperimentInfo
from services.reports.progress import experiment_row, recorded_of
from tests.e2e.cli import ROOT, run_module
from tests.support.event_builders import result_imported
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

EXP = "live-exp"
TRIALS = [f"{EXP}-t{i}" for i in range(4)]
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
"""When the test's trials started: 30 s before the test module loaded."""


@dataclass
class World:
    """The bus and ledger of one test, and the CLI's environment for them."""

    bus: JetStreamBus
    ledger: MongoLedger
    registry: NatsRunnerRegistry
    env: dict[str, str]

    async def cli(self, *args: str) -> tuple[int, str, str]:
        """``trialbus ARGS`` to completion: (exit code, stdout, stderr)."""
        done = await asyncio.to_thread(run_module, self.env, *args, timeout=60)
        return done.returncode, done.stdout, done.stderr

    async def record(self, trial_id: str, reward: float | None) -> None:
        """What the importer does with a result: a record, then ResultImported."""
        valid = reward is not None
        rec = TrialRecord(
            trial_id=trial_id,
            experiment_id=EXP,
            status="complete",
            provenance=Provenance(task_name="hello", agent_name="oracle"),
            evaluation=Evaluation(
                rewards={"reward": reward} if valid else {},
                main_reward_key="reward",
                main_reward=reward,
                reward_valid=valid,
            ),
            timing=PhaseTiming(started_at=T0, finished_at=T0 + timedelta(seconds=30)),
        )
        await self.ledger.upsert_records([rec])
        await self.bus.publish(
            result_imported(trial_id, experiment_id=EXP, scored=valid, main_reward=reward)
        )


@pytest.fixture
async def world(servers: Servers, topology: Topology, tmp_path: Path) -> AsyncIterator[World]:
    nc = await servers.connect()
    js = nc.jetstream()
    ledger = servers.ledger()
    await ledger.upsert_experiment(
        ExperimentInfo(EXP, "live demo", len(TRIALS), {"submitted_by": {"user": "alice"}})
    )
    env = servers.cli().env
    registry = await NatsRunnerRegistry.open(js, topology, create_ttl_s=30.0)
    try:
        yield World(JetStreamBus(js, topology), ledger, registry, env)
    finally:
        await ledger.close()
        await nc.close()


def _started(trial_id: str) -> TrialStarted:
    return TrialStarted(
        experiment_id=EXP, trial_id=trial_id, runner_id="r-1", host="hostA", attempt=1
    )


async def test_experiments_lists_progress_as_the_dashboard_computes_it(world: World) -> None:
    for trial in TRIALS[:2]:
        await world.bus.publish(_started(trial))
    await world.record(TRIALS[0], 1.0)

    code, stdout, stderr = await world.cli("experiments", "--json")

    assert code == 0, stderr
    [row] = json.loads(stdout)
    expected = {"done": 1, "running": 1, "queued": 2, "scored": 1, "unscored": 0, "total": 4}
    assert {k: row[k] for k in expected} == expected
    assert (row["experiment_id"], row["name"], row["submitted_by"]) == (
        EXP,
        "live demo",
        "alice",
    )
    assert (row["state"], row["started"]) == ("running", T0.isoformat())
    # The dashboard's function on the same ledger gives the same counts.
    info, records = await world.ledger.get_experiment(EXP), await world.ledger.records_for(EXP)
    dash = experiment_row(EXP, info, recorded_of(records, info), TRIALS[:2]).progress.as_dict()
    assert {k: dash[k] for k in expected} == expected


@contextlib.asynccontextmanager
async def spawned(env: dict[str, str], *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``trialbus ARGS`` running; killed at the end if it has not exited."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services",
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[dict[str, Any]]:
    while line := await asyncio.wait_for(stream.readline(), timeout=60):
        yield json.loads(line)


async def test_status_follow_ends_when_the_last_trial_is_recorded(world: World) -> None:
    await world.bus.publish(_started(TRIALS[0]))
    async with spawned(world.env, "status", EXP, "--follow", "--json") as proc:
        await _follow_status(world, proc)


async def _follow_status(world: World, proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None and proc.stderr is not None
    updates = _lines(proc.stdout)
    first = await anext(updates)
    assert (first["done"], first["running"], first["queued"]) == (0, 1, 3)
    assert first["rate_per_min"] is None and first["eta_s"] is None
    # Three of four recorded: it says so and keeps following (the control).
    for trial, reward in zip(TRIALS[:3], (1.0, 0.0, 1.0), strict=True):
        await world.record(trial, reward)
    while (update := await anext(updates))["done"] != 3:
        assert update["state"] == "running"
    assert proc.returncode is None and update["state"] == "running"
    # 3 recorded since the first start, T0 (set when the module loaded: at least 30 s
    # ago, and under a busy or parallel run much more): the rate lies between 3 per the
    # time elapsed by now and 3 per 30 s.
    elapsed_min = (datetime.now(UTC) - T0).total_seconds() / 60
    assert 3 / elapsed_min <= update["rate_per_min"] + 0.01  # printed to 2 decimals
    assert update["rate_per_min"] <= 3 / 30 * 60
    await world.record(TRIALS[3], None)  # an invalid reward: unscored
    while (update := await anext(updates))["done"] != 4:
        pass
    assert (update["state"], update["unscored"], update["eta_s"]) == ("complete", 1, 0.0)
    assert await asyncio.wait_for(proc.wait(), timeout=30) == 1, await proc.stderr.read()


async def test_status_follow_of_an_unknown_experiment_is_refused(world: World) -> None:
    code, _, stderr = await world.cli("status", "no-such-exp", "--follow")
    assert code == 2 and "no experiment 'no-such-exp'" in stderr


async def test_logs_print_one_trials_lines_and_follow_until_its_record(world: World) -> None:
    mine, other = TRIALS[0], TRIALS[1]
    for i, trial in enumerate((mine, other, mine)):
        await world.bus.publish(
            TrialLog(
                experiment_id=EXP, trial_id=trial, phase="agent", stream="stdout", text=f"l{i}\n"
            )
        )
    code, stdout, stderr = await world.cli("logs", mine)
    assert code == 0, stderr
    assert stdout == "l0\nl2\n"  # not the other trial's line
    code, stdout, _ = await world.cli("logs", mine, "--json")
    assert [json.loads(x)["text"] for x in stdout.splitlines()] == ["l0\n", "l2\n"]

    async with spawned(world.env, "logs", mine, "-f") as proc:
        await _follow_logs(world, proc, mine)


async def _follow_logs(world: World, proc: asyncio.subprocess.Process, mine: str) -> None:
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"l0\n"
    assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"l2\n"
    await world.bus.publish(
        TrialLog(
            experiment_id=EXP, trial_id=mine, phase="verification", stream="stdout", text="v\n"
        )
    )
    assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"v\n"
    assert proc.returncode is None  # control: no record yet, still following
    await world.record(mine, 1.0)
    assert await asyncio.wait_for(proc.wait(), timeout=30) == 0


async def test_trials_lists_the_running_ones_first_then_the_recorded(world: World) -> None:
    for trial in TRIALS[:2]:
        await world.bus.publish(_started(trial))
    await world.record(TRIALS[0], None)  # started, then recorded unscored
    code, stdout, stderr = await world.cli("trials", EXP, "--json")
    assert code == 0, stderr
    lines = json.loads(stdout)
    assert [(t["trial_id"], t["status"]) for t in lines] == [
        (TRIALS[1], "running"),
        (TRIALS[0], "complete"),  # its start is not listed again: it has a record
    ]
    assert (lines[0]["runner_host"], lines[0]["attempts"]) == ("hostA", 1)
    assert lines[0]["seconds"] >= 0 and lines[0]["unscored_cause"] is None
    # --unscored keeps the finished, unscored trial, not the running one.
    code, stdout, _ = await world.cli("trials", EXP, "--json", "--unscored")
    assert [t["trial_id"] for t in json.loads(stdout)] == [TRIALS[0]]
    code, stdout, _ = await world.cli("trials", EXP)
    assert "2 of 2 trials: 1 recorded, 1 running" in stdout, stdout


async def test_attach_shows_progress_and_its_trials_live_lines_until_the_end(
    world: World, tmp_path: Path
) -> None:
    await world.bus.publish(_started(TRIALS[0]))
    junit = tmp_path / "trials.xml"
    async with spawned(world.env, "attach", EXP, "--json", "--junit", str(junit)) as proc:
        await _attach(world, proc)
    # Written when the experiment ended: every trial a passed case.
    suites = ET.fromstring(junit.read_bytes())
    assert (suites.get("tests"), suites.get("failures"), suites.get("errors")) == ("4", "0", "0")


async def _attach(world: World, proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None and proc.stderr is not None
    updates = _lines(proc.stdout)
    first = await anext(updates)  # printed after both subscriptions were made
    assert "type" not in first and (first["done"], first["running"]) == (0, 1)

    def line(exp: str, trial: str, text: str) -> TrialLog:
        return TrialLog(
            experiment_id=exp, trial_id=trial, phase="agent", stream="stdout", text=text
        )

    # A line of another experiment's trial (the control) and one of this experiment's.
    await world.bus.publish(line("other-exp", "other-exp-t0", "not mine\n"))
    await world.bus.publish(line(EXP, TRIALS[0], "hello\n"))
    while (got := await anext(updates)).get("type") != "log":
        pass
    assert (got["trial_id"], got["stream"], got["text"]) == (TRIALS[0], "stdout", "hello\n")
    # A failed attempt is shown as it happens; a cancellation (the control) is not.
    # (Attempts 1 and 2: one attempt's two failures would share a dedup id.)
    failures = ((1, "cancelled", "Cancelled"), (2, "infrastructure", "SandboxStartError"))
    for n, cls, error in failures:
        await world.bus.publish(
            TrialFailed(
                experiment_id=EXP, trial_id=TRIALS[1], failure_class=cls, error_type=error,
                message="bwrap did not start\ndetail", attempt=n, final=False,
            )
        )  # fmt: skip
    while (got := await anext(updates)).get("type") != "failure":
        pass
    assert got == {
        "type": "failure", "trial_id": TRIALS[1], "attempt": 2, "final": False,
        "failure_class": "infrastructure", "error_type": "SandboxStartError",
        "message": "bwrap did not start\ndetail",
    }  # fmt: skip
    for trial in TRIALS[:3]:
        await world.record(trial, 1.0)
    while (update := await anext(updates)).get("done") != 3:
        assert update.get("text") != "not mine\n"
    assert proc.returncode is None  # control: one trial left, still attached
    await world.record(TRIALS[3], 1.0)
    rest = [json.loads(x) for x in (await proc.stdout.read()).splitlines()]
    assert rest[-1]["state"] == "complete" and rest[-1]["scored"] == 4, rest[-1]
    assert all(x.get("text") != "not mine\n" for x in rest)
    # Every trial scored: exit 0, as `submit --wait` (the status --follow test has 1).
    assert await asyncio.wait_for(proc.wait(), timeout=30) == 0, await proc.stderr.read()


async def test_runners_lists_the_registry_and_marks_a_stale_runner(world: World) -> None:
    now = datetime.now(UTC)
    fresh = RunnerInfo(
        runner_id="hostA-1", host="hostA", capabilities=["local"], labels=["gpu"], concurrency=4
    )
    # A runner whose last heartbeat is older than two beats (the bucket TTL is 30 s).
    stale = RunnerInfo(
        runner_id="hostB-2",
        host="hostB",
        pool="big",
        concurrency=2,
        last_seen=now - timedelta(seconds=25),
    )
    await world.registry.announce(fresh)
    await world.registry.announce(stale)

    code, stdout, stderr = await world.cli("runners", "--json")

    assert code == 0, stderr
    rows = {r["runner_id"]: r for r in json.loads(stdout)}
    assert set(rows) == {"hostA-1", "hostB-2"}
    assert (rows["hostA-1"]["stale"], rows["hostB-2"]["stale"]) == (False, True)
    a = rows["hostA-1"]
    assert (a["host"], a["pool"], a["capabilities"], a["labels"], a["concurrency"]) == (
        "hostA",
        "default",
        ["local"],
        ["gpu"],
        4,
    )
