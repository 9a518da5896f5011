"""HarborExecutor: runs each trial through Harbor's Python API, in its own process.

Each trial is a Harbor ``Trial`` whose trial_name is trialbus's trial_id, written
into the experiment's job folder (services.common.harbor_jobs), so ``harbor view``
opens it like any Harbor job. The Harbor side lives in services.runner.trial_process
and runs in a process forked per attempt (services.runner.isolation): nothing a trial
changes in its process (litellm's prices, environment, working directory, logging,
imported modules) reaches the runner or the next trial, and the runner's event loop
never runs Harbor's synchronous start-up.

The task folder comes from the runner's TaskCache (fetched from the tasks bucket by
checksum, verified, unpacked once per task and pinned while the trial runs); a task
that cannot be had ends the attempt as a failure naming why, never a hung message.
A request the runner's policy refuses (services.common.runner_policy) ends as a final
failure, ``PolicyRefused``, before Harbor builds anything.

The exception message an attempt reports (Harbor's, or an agent's, which may quote
an API key or the runner's own password) is redacted with the trial's secrets
(services.common.redaction.TrialSecrets) before it leaves the executor: everything
downstream (TrialFailed events, the agent-stop and budget guards, the ledger) gets
the redacted text only.
"""

from __future__ import annotations

import time
from importlib.metadata import version as dist_version
from pathlib import Path

from schemas.events import TrialRequested
from schemas.runners import RunnerPolicy
from services.common.errors import ObjectAccessDenied, ObjectCorrupt, ObjectMissing
from services.common.harbor_jobs import job_dir_for
from services.common.ports import ExecutionOutcome, LogSink
from services.common.redaction import TrialSecrets
from services.common.task_cache import TaskCache
from services.common.unpack import ArchiveError
from services.runner.isolation import TrialProcesses
from services.runner.trial_process import (
    BARE_SANDBOX,
    MissingSecretError,
    SandboxSettings,
    TrialJob,
)

__all__ = ["HarborExecutor", "MissingSecretError", "task_time_bound"]

SETUP_ALLOWANCE_S = 600.0
"""Agent setup and the environment's start and stop, which task.toml does not bound
(Harbor's agent classes set their own setup timeouts): added to a task's timeouts."""


def task_time_bound(task_dir: Path, multiplier: float) -> float | None:
    """An upper bound of one attempt of the task in ``task_dir``, in seconds: its
    environment build, agent and verifier timeouts (task.toml) times Harbor's timeout
    multiplier, plus ``SETUP_ALLOWANCE_S``. None when the task sets no agent timeout,
    has steps, or its task.toml cannot be read (a stop notice then assumes the trial
    cannot finish: the safe side)."""
    from harbor.models.task.config import TaskConfig

    try:
        config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    except Exception:  # noqa: BLE001 - Harbor reports a broken task.toml itself
        return None
    agent_s = config.agent.timeout_sec
    if agent_s is None or config.steps:
        return None
    phases = config.environment.build_timeout_sec + agent_s + config.verifier.timeout_sec
    return float(phases * multiplier + SETUP_ALLOWANCE_S)


BOUNDS_KEPT = 4096
"""Task time bounds a runner keeps (by task checksum and multiplier) before it starts over."""

MESSAGE_CUT_CHARS = 2000
"""Length services.runner.trial_process cuts exception messages to."""


class HarborExecutor:
    """Executor over Harbor (``harbor`` on PyPI, pinned in pyproject)."""

    name = "harbor"

    def __init__(
        self,
        jobs_root: Path,
        tasks: TaskCache,
        sandbox: SandboxSettings = BARE_SANDBOX,
        processes: TrialProcesses | None = None,
        policy: RunnerPolicy | None = None,
        secrets: TrialSecrets | None = None,
    ) -> None:
        """``sandbox``: what every trial's environment is given and held to;
        ``secrets``: redact exception messages with them (None: messages as they are)."""
        self._jobs_root = jobs_root
        # What manifests may ask of this runner; enforced in each trial's process
        # before Harbor sees the request (None: the safe default policy).
        self._policy_json = policy.model_dump_json() if policy is not None else None
        self._tasks = tasks
        self._sandbox = sandbox
        self._processes = processes or TrialProcesses()
        self._secrets = secrets
        self.version = dist_version("harbor")
        # Per running attempt (run id): the most it may take, from its executor start
        # (None: unknown). Read by a stop notice (services.runner.preemption).
        self._limits: dict[str, float | None] = {}
        # task_time_bound by (task checksum, multiplier): a task's content never changes
        # under its checksum, so its task.toml is parsed once per runner, not on the
        # event loop at every trial's start.
        self._bounds: dict[tuple[str, float], float | None] = {}

    def _task_bound(self, checksum: str, task_dir: Path, multiplier: float) -> float | None:
        key = (checksum, multiplier)
        if key not in self._bounds:
            if len(self._bounds) >= BOUNDS_KEPT:
                self._bounds.clear()
            self._bounds[key] = task_time_bound(task_dir, multiplier)
        return self._bounds[key]

    def time_limit_s(self, request: TrialRequested) -> float | None:
        """The most the running attempt of ``request`` may take from its start: the
        task's timeouts (``task_time_bound``) plus the time its task took to fetch;
        None before the task is unpacked, or when the task sets no agent timeout."""
        return self._limits.get(request.dedup_id())

    def trial_dir_for(self, req: TrialRequested) -> Path:
        """Where Harbor writes this trial's folder."""
        return job_dir_for(self._jobs_root, req.experiment_id) / req.trial_id

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Run one attempt in a fresh process; cancellation stops that process."""
        task = request.task
        began = time.monotonic()
        try:
            async with self._tasks.use(task.checksum, task.name) as task_dir:
                bound = self._task_bound(
                    task.checksum, task_dir, request.compute.timeout_multiplier
                )
                self._limits[request.dedup_id()] = (
                    None if bound is None else time.monotonic() - began + bound
                )
                job = TrialJob(
                    request_json=request.model_dump_json(),
                    attempt=attempt,
                    task_dir=str(task_dir),
                    jobs_root=str(self._jobs_root),
                    sandbox=self._sandbox,
                    live_logs=on_log is not None,
                    policy_json=self._policy_json,
                )
                outcome = await self._processes.run(
                    job, on_log, llm=request.agent.model is not None
                )
        except (ObjectMissing, ObjectCorrupt, ObjectAccessDenied, ArchiveError) as exc:
            # ObjectCorrupt is retried (a fresh download may be whole); a missing or
            # unsafe archive is final (services.common.failures).
            return ExecutionOutcome(
                kind="failed",
                exception_type=type(exc).__name__,
                message=f"task {task.name} ({task.checksum[:12]}): {exc}"[:2000],
            )
        finally:
            self._limits.pop(request.dedup_id(), None)
        trial_dir = outcome.get("trial_dir")
        message = outcome.get("message")
        if message and self._secrets is not None:
            redactor = self._secrets.redactor(request)
            # The trial process cuts messages to MESSAGE_CUT_CHARS: a secret may be
            # cut in two there, its beginning left at the end.
            cut = len(message) >= MESSAGE_CUT_CHARS
            message = redactor.redact_cut(message) if cut else redactor.redact(message)
        return ExecutionOutcome(
            kind=outcome["kind"],
            trial_dir=Path(trial_dir) if trial_dir else None,
            exception_type=outcome.get("exception_type"),
            message=message,
        )
