"""HarborExecutor: runs a trial through Harbor's async Python API.

Each trial is a Harbor ``Trial`` whose trial_name is trialbus's trial_id, written
into the experiment's job folder (services.common.harbor_jobs), so ``harbor view``
opens it like any Harbor job.
"""

from __future__ import annotations

import os
import shutil
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from schemas.events import TrialRequested
from services.common.harbor_jobs import ensure_job_dir, job_dir_for, job_uuid
from services.common.ports import ExecutionOutcome, LogSink


class MissingSecretError(RuntimeError):
    """The runner lacks an environment variable an agent needs (configuration error)."""


class HarborExecutor:
    """Executor over Harbor (``harbor`` on PyPI, pinned in pyproject)."""

    name = "harbor"

    def __init__(self, jobs_root: Path, sandbox_dir: Path | None = None) -> None:
        self._jobs_root = jobs_root
        self._sandbox_dir = sandbox_dir
        self.version = dist_version("harbor")

    def _trial_config(self, req: TrialRequested, job_dir: Path) -> Any:
        from harbor.models.trial.config import (
            AgentConfig,
            EnvironmentConfig,
            TaskConfig,
            TrialConfig,
        )

        missing = [n for n in req.agent.api_key_env if n not in os.environ]
        if missing:
            raise MissingSecretError(
                f"runner has no environment variable {', '.join(missing)} "
                f"(listed in api_key_env of agent {req.agent.display!r})"
            )
        compute = req.compute
        env_kwargs = dict(compute.environment_kwargs)
        if compute.environment_import_path and self._sandbox_dir is not None:
            env_kwargs.setdefault("scratch_dir", str(self._sandbox_dir))
        return TrialConfig(
            task=TaskConfig(path=Path(req.task.path)),
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

    def trial_dir_for(self, req: TrialRequested) -> Path:
        """Where Harbor writes this trial's folder."""
        return job_dir_for(self._jobs_root, req.experiment_id) / req.trial_id

    def _job_config(self, req: TrialRequested, job_dir: Path) -> dict[str, Any]:
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

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        from harbor.trial.hooks import LogEntry
        from harbor.trial.trial import Trial

        job_dir = job_dir_for(self._jobs_root, request.experiment_id)
        ensure_job_dir(
            job_dir,
            experiment_id=request.experiment_id,
            name=request.experiment_id,
            job_config=self._job_config(request, job_dir),
        )
        trial_dir = job_dir / request.trial_id
        if trial_dir.exists():
            # A previous attempt (crashed runner, or a retry) left its folder: keep it
            # for diagnosis, out of the way of Harbor and `harbor view`.
            attempts_dir = job_dir / ".attempts"
            attempts_dir.mkdir(exist_ok=True)
            shutil.move(trial_dir, attempts_dir / f"{request.trial_id}.{attempt - 1}")
        try:
            trial = await Trial.create(self._trial_config(request, job_dir))
        except Exception as exc:  # noqa: BLE001 - every cause becomes a TrialFailed
            return ExecutionOutcome(
                kind="failed",
                job_dir=job_dir,
                exception_type=type(exc).__name__,
                message=str(exc)[:2000] or type(exc).__name__,
            )
        if on_log is not None:
            sink = on_log

            async def forward(entry: LogEntry) -> None:
                await sink(entry.phase, entry.stream, entry.text)

            trial.add_log_callback(forward)
        result = await trial.run()
        exc_info = result.exception_info
        if not (trial_dir / "result.json").is_file():
            return ExecutionOutcome(
                kind="failed",
                trial_dir=trial_dir,
                job_dir=job_dir,
                exception_type=exc_info.exception_type if exc_info else "MissingResult",
                message="Harbor finished without writing result.json",
            )
        return ExecutionOutcome(
            kind="completed",
            trial_dir=trial_dir,
            job_dir=job_dir,
            exception_type=exc_info.exception_type if exc_info else None,
            message=exc_info.exception_message[:2000] if exc_info else None,
        )
