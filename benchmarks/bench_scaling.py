"""2. Horizontal scaling on this machine's cores.

- one core: one runner, and every other stack process, pinned to core 0;
- two cores: runner i pinned to core i, the rest of the stack free on both cores;
- bare Harbor pinned to core 0 (its subprocesses inherit the pinning).

Each runner runs C trials at once; all three run the same trials. Scaling
efficiency = (two-core throughput / one-core throughput) / 2.
"""

from __future__ import annotations

import os

from benchmarks.bench_overhead import check_same_outcome, run_trialbus, workload_for
from benchmarks.harbor_cli import HarborRun, run_harbor
from benchmarks.harness import BenchResult, Context, Figure, median
from benchmarks.stack import ExperimentRun


def run(ctx: Context) -> BenchResult:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise RuntimeError("the scaling benchmark needs two cores")
    a, b = cores[0], cores[1]
    workload = workload_for(ctx)
    one: list[ExperimentRun] = []
    two: list[ExperimentRun] = []
    harbor: list[HarborRun] = []
    for i in range(ctx.runs):
        ctx.log(f"scaling run {i + 1}/{ctx.runs}: one runner, everything on core {a}")
        run1, _ = run_trialbus(
            ctx, workload, f"scaling-1core-{i}", infra_cpus={a}, runner_cpus=[{a}]
        )
        one.append(run1)
        ctx.log(f"scaling run {i + 1}/{ctx.runs}: two runners on cores {a} and {b}")
        run2, _ = run_trialbus(
            ctx,
            workload,
            f"scaling-2core-{i}",
            n_runners=2,
            infra_cpus={a, b},
            runner_cpus=[{a}, {b}],
        )
        two.append(run2)
        ctx.log(f"scaling run {i + 1}/{ctx.runs}: harbor run pinned to core {a}")
        harbor.append(run_harbor(workload, ctx.path(f"scaling-harbor-{i}"), cpus={a}))
        check_same_outcome(workload, harbor[-1], run1)
        check_same_outcome(workload, harbor[-1], run2)
    n = workload.n_trials
    thr1 = n / median([r.wall_s for r in one])
    thr2 = n / median([r.wall_s for r in two])
    thr_h = n / median([h.job_s for h in harbor])
    split = [min(r.runners.values(), default=0) / max(1, r.n_trials) for r in two]
    return BenchResult(
        name="scaling",
        title="Horizontal scaling: two runners on two cores vs one runner on one core",
        value=thr2 / thr1 / 2,
        unit="efficiency",
        target=0.9,
        target_op=">=",
        runs=[(n / r2.wall_s) / (n / r1.wall_s) / 2 for r1, r2 in zip(one, two, strict=True)],
        peers=[
            Figure("trialbus_1core_trials_per_s", thr1, "trials/s", "one runner, all on one core"),
            Figure("trialbus_2core_trials_per_s", thr2, "trials/s", "two runners, one per core"),
            Figure("harbor_1core_trials_per_s", thr_h, "trials/s", "harbor run pinned to one core"),
            Figure(
                "trialbus_vs_harbor_1core",
                thr1 / thr_h,
                "ratio",
                "one-core throughput, trialbus / bare Harbor",
            ),
            Figure(
                "trialbus_1core_cpu_ms_per_trial",
                median([r.cpu_ms_per_trial for r in one]),
                "ms",
            ),
            Figure(
                "trialbus_2core_cpu_ms_per_trial",
                median([r.cpu_ms_per_trial for r in two]),
                "ms",
            ),
            Figure(
                "harbor_1core_cpu_ms_per_trial",
                median([h.cpu_ms_per_trial for h in harbor]),
                "ms",
            ),
            Figure(
                "smaller_runner_share",
                median(split),
                "fraction",
                "trials run by the less busy runner (0.5 = even split)",
            ),
        ],
        config={
            "trials": n,
            "concurrency_per_runner": workload.concurrency,
            "cores": [a, b],
            "runs": ctx.runs,
        },
    )
