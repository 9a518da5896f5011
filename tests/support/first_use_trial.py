"""One real local-environment trial in a process forked from a prepared parent; prints
(JSON) the modules the trial's process imported that its parent had not, whether it
compiled the sandbox's seccomp filter itself, and which of Harbor's pydantic models it
had to build.

``python -m tests.support.first_use_trial MODE WORK_DIR``. MODE ``forkserver``: the
parent is set up as the runner's trial forkserver is (services.runner.forkserver_preload);
``bare``: it imports only the trial machinery (the negative control: a trial's first
use of dirhash and the others then shows). The child runs
services.runner.trial_process.run_trial, the code a runner's trial process runs, on
the oracle agent and the hello-file example task.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from multiprocessing import Pipe
from pathlib import Path

from schemas.manifest import AgentSpec, ComputeSpec
from tests.support.work_requests import hello_file_request

ROOT = Path(__file__).resolve().parents[2]
HELLO_FILE = ROOT / "examples" / "tasks" / "hello-file"


def prepare(mode: str) -> None:
    """Set this process up as the trial's parent."""
    if mode == "forkserver":
        importlib.import_module("services.runner.forkserver_preload")
    elif mode == "bare":
        # What the forkserver imported before it warmed a trial's first use (importing
        # forkserver_preload itself would do its whole set-up).
        for name in ("harbor.trial.trial", "services.localenv.environment"):
            importlib.import_module(name)
    else:
        raise SystemExit(f"unknown mode {mode!r}: forkserver or bare")


def child(work: Path) -> None:
    """Run the trial, write the new modules and the outcome kind; never return."""
    from services.localenv.seccomp import filter_program
    from services.runner.isolation import incomplete_harbor_models
    from services.runner.trial_process import SandboxSettings, TrialJob, run_trial

    unbuilt = {m.__qualname__ for m in incomplete_harbor_models()}
    before = set(sys.modules)
    compiled = filter_program.cache_info().misses
    request = hello_file_request(
        "hello-file__first-use",
        AgentSpec(name="oracle"),
        experiment_id="exp-first-use",
        correlation_id="corr",
        task_path=str(HELLO_FILE),
        compute=ComputeSpec(environment="local"),
    )
    job = TrialJob(
        request_json=request.model_dump_json(),
        attempt=1,
        task_dir=str(HELLO_FILE),
        jobs_root=str(work / "jobs"),
        sandbox=SandboxSettings(scratch_dir=work / "sandboxes"),
        live_logs=False,
    )
    _recv, send = Pipe(duplex=False)  # nothing is read: live_logs is off
    outcome = asyncio.run(run_trial(job, send))
    new = sorted(set(sys.modules) - before)
    report = {
        "kind": outcome["kind"],
        "new": new,
        "seccomp_compiled_in_trial": filter_program.cache_info().misses - compiled,
        "models_built_in_trial": sorted(
            unbuilt - {m.__qualname__ for m in incomplete_harbor_models()}
        ),
    }
    (work / "report.json").write_text(json.dumps(report))
    os._exit(0)


def main(mode: str, work: Path) -> None:
    prepare(mode)
    pid = os.fork()
    if pid == 0:
        try:
            child(work)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"trial process failed (wait status {status})")
    print((work / "report.json").read_text())


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
