"""14. Hand-offs: a pool where one runner lacks the agent's key (wall, mixed / keyed alone).

A pool's runners share one durable, so a runner without the key an agent names
(``api_key_env``) fetches its trials too and hands each to a peer that has the key
(services.common.fit, services/runner/fit.py). N keyed trials (200; 40 quick) of the
instant executor (0.5 s each; 0.2 s quick) run on a fresh stack, ``runs`` times each
way:

- ``alone``: the keyed runner only (concurrency 4);
- ``mixed``: the keyed runner and a keyless one (concurrency 4 each).

The headline is the mixed wall over the alone one (submit to the last ResultImported):
the keyless runner should cost the keyed one nothing. Beside it, the hand-offs per
trial (the pool durables' deliveries beyond one per trial). Before the consumer backed
off its fetches while it could run none of what it fetched (``HANDOFF_BACKOFF_S``),
the same run took 47 % longer mixed than alone (38.5 s against 26.0 s; per run 1.45,
1.49, 1.47) with 7.07 hand-offs per trial: this benchmark on 2026-11-27, the back-off
switched off.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import yaml

from benchmarks.harness import BenchResult, Context, Figure, median
from benchmarks.instant_executor import EXECUTOR_SPEC
from benchmarks.stack import BenchStack, run_experiment
from schemas.subjects import DEFAULT_POOL
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.priority import DEFAULT_PRIORITY_CLASSES

KEY = "ANTHROPIC_API_KEY"
CONCURRENCY = 4
TARGET_RATIO = 1.10
READY_S = 120.0
EXAMPLE_TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "hello-file"


def manifest(folder: Path, n: int) -> Path:
    """``n`` trials (in agents of 25 repetitions) whose agent names ``KEY``."""
    reps = 25 if n % 25 == 0 else n
    agents = [
        {"name": "nop", "kwargs": {"variant": i}, "api_key_env": [KEY]} for i in range(n // reps)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "handoff.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "handoff",
                "tasks": [str(EXAMPLE_TASK)],
                "agents": agents,
                "repetitions": reps,
                "compute": {"environment": "local", "n_concurrent_trials": 1000},
            }
        )
    )
    return path


async def wait_for_runners(stack: BenchStack, ids: set[str]) -> None:
    """Until every runner of ``ids`` is in the registry (it pulls work by then)."""
    nc = await nats.connect(stack.nats_url, name="bench-handoff")
    try:
        registry = await NatsRunnerRegistry.open(nc.jetstream(), stack.topology)
        deadline = time.monotonic() + READY_S
        while not ids <= {r.runner_id for r in await registry.live_runners()}:
            if time.monotonic() > deadline:
                raise TimeoutError(f"runners {sorted(ids)} not live after {READY_S:.0f} s")
            await asyncio.sleep(0.1)  # the registry has no event to wait on
    finally:
        await nc.close()


async def deliveries(stack: BenchStack) -> int:
    """Work messages the pool's durables delivered, every priority class."""
    nc = await nats.connect(stack.nats_url, name="bench-handoff")
    try:
        js, topo, classes = nc.jetstream(), stack.topology, DEFAULT_PRIORITY_CLASSES
        total = 0
        for name in classes.names:
            durable = topo.runner_durable_for(DEFAULT_POOL, classes.durable_class(name))
            total += (await js.consumer_info(topo.work_stream, durable)).delivered.consumer_seq
        return total
    finally:
        await nc.close()


def one_run(ctx: Context, mixed: bool, n: int, delay_s: float, i: int) -> tuple[float, int]:
    """(wall seconds, hand-offs) of one experiment on a fresh stack."""
    name = "mixed" if mixed else "alone"
    env = {"TRIALBUS_EXECUTOR": EXECUTOR_SPEC, "TRIALBUS_INSTANT_DELAY_S": str(delay_s)}
    stack = BenchStack(
        ctx.path("handoff", f"{name}{i}"), n_runners=0, concurrency=CONCURRENCY, runner_env=env
    )
    with stack:
        keyed = stack.stack.add_runner({KEY: "not-a-real-key", "TRIALBUS_RUNNER_ID": "keyed"})
        ids = {"keyed"}
        if mixed:
            stack.stack.add_runner({KEY: "", "TRIALBUS_RUNNER_ID": "keyless"})
            ids.add("keyless")
        asyncio.run(wait_for_runners(stack, ids))
        run = asyncio.run(run_experiment(stack, manifest(ctx.path("handoff"), n)))
        if set(run.runners) != {"keyed"}:
            raise AssertionError(f"trials started on {dict(run.runners)}, not only the keyed")
        handoffs = asyncio.run(deliveries(stack)) - run.n_trials
        if keyed.proc is None or keyed.proc.poll() is not None:
            raise AssertionError("the keyed runner exited during the run")
    ctx.log(f"handoff: {name} {run.wall_s:.1f} s, {handoffs} hand-offs")
    return run.wall_s, handoffs


def run(ctx: Context) -> BenchResult:
    n, delay_s = (40, 0.2) if ctx.quick else (200, 0.5)
    ctx.log(f"handoff: {n} keyed trials, {ctx.runs} runs")
    alone: list[float] = []
    mixed: list[float] = []
    handoffs: list[int] = []
    for i in range(ctx.runs):
        alone.append(one_run(ctx, False, n, delay_s, i)[0])
        wall, given = one_run(ctx, True, n, delay_s, i)
        mixed.append(wall)
        handoffs.append(given)
    ratios = [m / a for m, a in zip(mixed, alone, strict=True)]
    return BenchResult.ratio(
        "handoff",
        f"Hand-offs: {n} keyed trials, a keyless runner beside the keyed one "
        "(wall, mixed / alone, p50)",
        [round(r, 3) for r in ratios],
        TARGET_RATIO,
        [
            Figure("alone_s", median(alone), "s", "the keyed runner alone"),
            Figure("mixed_s", median(mixed), "s", "a keyless runner beside it"),
            Figure(
                "handoffs_per_trial",
                median([h / n for h in handoffs]),
                "ratio",
                "deliveries beyond one per trial (7.07 before the back-off)",
            ),
        ],
        {"trials": n, "trial_s": delay_s, "concurrency": CONCURRENCY},
    )
