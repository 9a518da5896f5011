"""The bare-Harbor side: ``harbor run -c job.yaml`` as a user runs it.

The process's CPU time comes from ``wait4`` (it and every descendant it reaped:
bwrap, bash, the verifier); its wall time from start to exit; Harbor's own job time
(``started_at`` -> ``finished_at`` in the job's result.json) excludes the CLI's
interpreter start and imports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks.harness import REPO, fresh_dir, own_affinity
from benchmarks.workload import Workload

HARBOR = Path(sys.executable).parent / "harbor"


class HarborRunError(RuntimeError):
    """``harbor run`` failed or did not run every trial cleanly."""


@dataclass(frozen=True, slots=True)
class HarborRun:
    """One ``harbor run``."""

    n_trials: int
    process_wall_s: float
    job_s: float
    cpu_s: float
    reward_sum: float

    @property
    def cpu_ms_per_trial(self) -> float:
        return 1000 * self.cpu_s / self.n_trials


def run_harbor(
    workload: Workload,
    run_dir: Path,
    *,
    cpus: set[int] | None = None,
    env: dict[str, str] | None = None,
    warm_up: bool = True,
    timeout_s: float = 1800,
) -> HarborRun:
    """Run ``workload`` with ``harbor run`` in a fresh ``run_dir`` (cwd: the repo, so the
    environment's import path resolves), optionally pinned to ``cpus``.

    With ``warm_up``, a one-repetition job of the same tasks and agents runs first in
    the same sandbox folder (untimed), so the environment's per-task layer cache is
    as warm as on trialbus's warmed-up stack; no trial result is shared.
    """
    fresh_dir(run_dir)
    if warm_up:
        small = dataclasses.replace(workload, name=f"warmup-{workload.name}", repetitions=1)
        # Untimed and unchecked: a warm-up trial that fails changes no measured one.
        _run_job(small, run_dir, cpus=cpus, env=env, timeout_s=timeout_s, check=False)
    return _run_job(workload, run_dir, cpus=cpus, env=env, timeout_s=timeout_s)


def _run_job(
    workload: Workload,
    run_dir: Path,
    *,
    cpus: set[int] | None,
    env: dict[str, str] | None,
    timeout_s: float,
    check: bool = True,
) -> HarborRun:
    jobs_dir = run_dir / "jobs"
    config = workload.harbor_job_config(
        run_dir / f"{workload.name}.yaml", jobs_dir, run_dir / "sandboxes"
    )
    log_path = run_dir / f"{workload.name}.log"
    with log_path.open("wb") as log, own_affinity(cpus):
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(HARBOR), "run", "-c", str(config), "-y"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise HarborRunError(f"harbor run took more than {timeout_s:.0f}s; see {log_path}")
            time.sleep(0.01)  # polling for exit; wait4 has no timeout
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise HarborRunError(f"harbor run exited with {proc.returncode}; see {log_path}")
    job_dir = jobs_dir / workload.name
    result = json.loads((job_dir / "result.json").read_text())
    stats = result["stats"]
    if check and (stats["n_completed_trials"] != workload.n_trials or stats["n_errored_trials"]):
        raise HarborRunError(
            f"harbor ran {stats['n_completed_trials']} of {workload.n_trials} trials "
            f"({stats['n_errored_trials']} errored); see {job_dir}"
        )
    started = datetime.fromisoformat(result["started_at"])
    finished = datetime.fromisoformat(result["finished_at"])
    return HarborRun(
        n_trials=workload.n_trials,
        process_wall_s=wall,
        job_s=(finished - started).total_seconds(),
        cpu_s=usage.ru_utime + usage.ru_stime,
        reward_sum=_reward_sum(job_dir),
    )


def _reward_sum(job_dir: Path) -> float:
    total = 0.0
    for result in job_dir.glob("*/result.json"):
        verifier = json.loads(result.read_text()).get("verifier_result") or {}
        total += float((verifier.get("rewards") or {}).get("reward", 0.0))
    return total
