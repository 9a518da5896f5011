"""One trial in its own process: the Harbor side of HarborExecutor (runs in the child).

A runner lives for days and runs trials of many experiments; Harbor and the agents it
loads were written for ``harbor run``, one process per job. What a trial changes in its
process stays there: prices registered in litellm's model table (terminus-2's
``model_info``), ``os.environ``, the working directory, logging configuration, agent
modules imported or patched. So every attempt runs in a fresh child forked from a
clean, pre-imported parent (services.runner.isolation), and is gone when it ends.

This module is what the child executes: cut the process's environment down to what
the trial may see (services.runner.trial_env), build Harbor's TrialConfig, run the Trial,
stream its live output and then its outcome back over a pipe. The runner sends
SIGUSR1 to stop it (the experiment was cancelled, or the runner is shutting down).
SIGTERM and SIGINT are ignored: the stack signals the runner's whole process group,
and a draining runner lets running trials finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from schemas.events import TrialRequested
from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH
from schemas.runners import RunnerPolicy, forbidden_secret_name
from services.common.harbor_jobs import ensure_job_dir, job_dir_for, job_uuid
from services.common.runner_policy import (
    POLICY_REFUSED,
    UNKNOWN_AGENT,
    harbor_agent_names,
    request_refusals,
    task_template_refusals,
    unknown_agent,
)
from services.common.task_variables import required_task_secrets, task_templates
from services.runner.trial_env import restrict_environ

_PR_SET_PDEATHSIG = 1


class MissingSecretError(RuntimeError):
    """The runner lacks an environment variable an agent needs (configuration error)."""


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """What the runner gives and imposes on every trial's environment (RunnerSettings)."""

    scratch_dir: Path | None = None
    """Scratch root of an environment that takes one (RunnerSettings.sandbox_dir)."""
    hidden_paths: tuple[Path, ...] = ()
    """Host paths the local sandbox hides from the trial (RunnerSettings.hidden_from_trials)."""
    disk_mb: int = 0
    """A local-environment trial's disk quota in MB (RunnerSettings.sandbox_disk_mb; 0: none)."""
    userns_base: int | None = None
    """Host uid of root inside a local trial (RunnerSettings.sandbox_userns; None: uid 0)."""


BARE_SANDBOX: Final = SandboxSettings()
"""A sandbox no setting shapes: no scratch root, nothing hidden, no disk quota, root
inside a local trial is uid 0."""


@dataclass(frozen=True, slots=True)
class TrialJob:
    """What the child needs to run one attempt (pickled to it)."""

    request_json: str
    attempt: int
    task_dir: str
    jobs_root: str
    sandbox: SandboxSettings
    live_logs: bool
    policy_json: str | None = None
    """The runner's policy (schemas.runners.RunnerPolicy as JSON); None: the safe default."""


Outcome = dict[str, Any]
"""ExecutionOutcome's fields as plain data (kind, trial_dir, exception_type, message):
what crosses the pipe."""


def failed(exception_type: str, message: str, trial_dir: str | None = None) -> Outcome:
    """A ``failed`` outcome."""
    return {
        "kind": "failed",
        "exception_type": exception_type,
        "message": message,
        "trial_dir": trial_dir,
    }


def trial_config(
    req: TrialRequested, task_dir: Path, job_dir: Path, sandbox: SandboxSettings
) -> Any:
    """Harbor's TrialConfig for one request (the agent's secrets stay templates), in
    the runner's ``sandbox``."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig

    # os.environ is the trial's by now (restrict_environ): it keeps every allowed
    # api_key_env name the runner has, so a missing one is missing on the runner.
    missing = [n for n in req.agent.api_key_env if not os.environ.get(n)]  # "" is no key
    if missing:
        raise MissingSecretError(
            f"runner has no environment variable {', '.join(missing)} "
            f"(listed in api_key_env of agent {req.agent.display!r})"
        )
    # Harbor would fail the trial on these with a bare ValueError, retried as if the
    # infrastructure were at fault: every attempt fails the same way.
    unset = [(f, n) for f, n in required_task_secrets(task_dir) if not os.environ.get(n)]
    if unset:
        raise MissingSecretError(
            f"runner has no environment variable {', '.join(dict.fromkeys(n for _, n in unset))} "
            f"(task {req.task.name}: {'; '.join(f for f, _ in unset)})"
        )
    compute = req.compute
    env_kwargs = dict(compute.environment_kwargs)
    if compute.environment_import_path and sandbox.scratch_dir is not None:
        env_kwargs.setdefault("scratch_dir", str(sandbox.scratch_dir))
    if compute.environment_import_path == LOCAL_ENVIRONMENT_IMPORT_PATH:
        # The runner's own paths are always hidden: a manifest may add, never remove.
        asked = env_kwargs.get("hidden_paths")
        hidden = [str(p) for p in sandbox.hidden_paths]
        env_kwargs["hidden_paths"] = [*hidden, *(asked if isinstance(asked, list) else [])]
        # The runner's quota is a ceiling: a manifest may lower it, never raise or lift it.
        asked_disk = env_kwargs.get("disk_mb")
        quotas = [m for m in (asked_disk, sandbox.disk_mb) if type(m) is int and m > 0]
        env_kwargs["disk_mb"] = min(quotas) if quotas else 0
        if sandbox.userns_base is not None:
            # The runner's shifted root is a floor: a manifest cannot turn it back.
            env_kwargs["userns"] = "shifted"
            env_kwargs["userns_base"] = sandbox.userns_base
    return TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=req.trial_id,
        trials_dir=job_dir,
        timeout_multiplier=compute.timeout_multiplier,
        agent=AgentConfig(
            name=req.agent.name,
            import_path=req.agent.import_path,
            model_name=req.agent.model,
            kwargs=dict(req.agent.kwargs),
            # Templates, not values: Harbor resolves ${NAME} from the runner's
            # environment when the agent starts, so no secret enters a config,
            # an event, a record or a log.
            env={n: f"${{{n}}}" for n in req.agent.api_key_env},
        ),
        environment=EnvironmentConfig(
            type=compute.environment_type,
            import_path=compute.environment_import_path,
            kwargs=env_kwargs,
        ),
        job_id=job_uuid(req.experiment_id),
    )


def job_config(req: TrialRequested, job_dir: Path) -> dict[str, Any]:
    """The job-level config written once per experiment (what `harbor view` shows)."""
    return {
        "job_name": req.experiment_id,
        "jobs_dir": str(job_dir.parent),
        "n_concurrent_trials": req.compute.n_concurrent_trials,
        "timeout_multiplier": req.compute.timeout_multiplier,
        "environment": {
            "type": req.compute.environment_type,
            "import_path": req.compute.environment_import_path,
            "kwargs": req.compute.environment_kwargs,
        },
    }


def job_policy(job: TrialJob) -> RunnerPolicy:
    """The runner's policy sent with ``job`` (the safe default when none was)."""
    return RunnerPolicy.model_validate_json(job.policy_json) if job.policy_json else RunnerPolicy()


def trial_grant(job: TrialJob, request: TrialRequested) -> list[str]:
    """Secret names this trial may be given: its agent's ``api_key_env`` and the
    names its task templates, each only if the runner's policy allows it (a request
    naming another is refused before Harbor runs)."""
    policy = job_policy(job)
    names = [*request.agent.api_key_env, *(v for _, v in task_templates(Path(job.task_dir)))]
    return [n for n in names if n in policy.allowed_secrets and not forbidden_secret_name(n)]


def policy_refusals(job: TrialJob, request: TrialRequested) -> list[str]:
    """What the runner's policy refuses in this request and its task (empty: allowed).

    Checked before Harbor sees the request: nothing it names is imported, no runner
    variable is resolved, no folder is made."""
    policy = job_policy(job)
    return [
        *request_refusals(policy, request.agent, request.compute, on_host=True),
        *task_template_refusals(policy, Path(job.task_dir), request.task.name),
    ]


async def run_trial(job: TrialJob, conn: Connection) -> Outcome:
    """Run one attempt with Harbor; live output goes to ``conn`` as it comes."""
    from harbor.trial.hooks import LogEntry
    from harbor.trial.trial import Trial

    request = TrialRequested.model_validate_json(job.request_json)
    # Before anything of the request runs: the runner's environment (its ledger and
    # bus credentials, cloud keys) is cut down to what this trial may see.
    restrict_environ(trial_grant(job, request), job_policy(job).pass_env)
    refusals = policy_refusals(job, request)
    if refusals:
        return failed(POLICY_REFUSED, ("runner policy: " + "; ".join(refusals))[:2000])
    name = request.agent.name
    unknown = unknown_agent(name, harbor_agent_names()) if name is not None else None
    if unknown is not None:
        # Harbor would raise a bare ValueError in Trial.create, which reads as an
        # infrastructure failure and is retried; every attempt fails the same way.
        return failed(UNKNOWN_AGENT, f"agent.name: {unknown}"[:2000])
    job_dir = job_dir_for(Path(job.jobs_root), request.experiment_id)
    ensure_job_dir(
        job_dir,
        experiment_id=request.experiment_id,
        name=request.experiment_id,
        job_config=job_config(request, job_dir),
    )
    trial_dir = job_dir / request.trial_id
    if trial_dir.exists():
        # A previous attempt (crashed runner, or a retry) left its folder: keep it
        # for diagnosis, out of the way of Harbor and `harbor view`.
        attempts_dir = job_dir / ".attempts"
        attempts_dir.mkdir(exist_ok=True)
        shutil.move(trial_dir, attempts_dir / f"{request.trial_id}.{job.attempt - 1}")
    try:
        config = trial_config(request, Path(job.task_dir), job_dir, job.sandbox)
        trial = await Trial.create(config)
    except Exception as exc:  # noqa: BLE001 - every cause becomes a TrialFailed
        return failed(type(exc).__name__, str(exc)[:2000] or type(exc).__name__)
    if job.live_logs:

        async def forward(entry: LogEntry) -> None:
            conn.send(("log", entry.phase, entry.stream, entry.text))

        trial.add_log_callback(forward)
    result = await trial.run()
    exc_info = result.exception_info
    if not (trial_dir / "result.json").is_file():
        return failed(
            exc_info.exception_type if exc_info else "MissingResult",
            "Harbor finished without writing result.json",
            trial_dir=str(trial_dir),
        )
    return {
        "kind": "completed",
        "trial_dir": str(trial_dir),
        "exception_type": exc_info.exception_type if exc_info else None,
        "message": exc_info.exception_message[:2000] if exc_info else None,
    }


async def _main(job: TrialJob, conn: Connection) -> None:
    """The trial, stopped by SIGUSR1; its ending is sent from here, before the event
    loop's teardown (tasks cancelled, thread pool joined), which the runner need not
    wait for: it reaps the process in the background (services.runner.isolation)."""
    task = asyncio.create_task(run_trial(job, conn))
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, task.cancel)
    try:
        outcome = await task
    except asyncio.CancelledError:
        conn.send(("cancelled", None))  # the runner asked for it
        return
    conn.send(("outcome", outcome))


def child_main(job: TrialJob, conn: Connection) -> None:
    """Entry point of the trial's process (a fork of the runner's forkserver)."""
    # Killed with the forkserver, which lives exactly as long as the runner.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_main(job, conn))
    except BaseException as exc:  # noqa: BLE001 - reported to the runner, then exit
        # Ignored by the runner if the ending was sent already (it reads the first).
        with contextlib.suppress(OSError):
            message = str(exc)[:2000] or type(exc).__name__
            conn.send(("outcome", failed(type(exc).__name__, message)))
    finally:
        conn.close()
