"""InstantExecutor: completes trials without running anything (benchmarks, load tests).

Benchmark and test support, not a production executor: it lives outside the services
package and a runner loads it by import path,
``TRIALBUS_EXECUTOR=benchmarks.instant_executor:from_settings``. It writes a small
result.json shaped like Harbor's, so the importer and ledger do their full work; only
Harbor is left out. Its own settings (``InstantSettings``) come from the environment:
``TRIALBUS_INSTANT_DELAY_S`` makes each trial take that long (slow trials in flight
without CPU cost); ``TRIALBUS_INSTANT_FAIL_WITH`` fails every attempt with that Harbor
exception name (retry tests).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.events import TrialRequested
from services.common.harbor_jobs import ensure_job_dir, job_dir_for, job_uuid
from services.common.ports import ExecutionOutcome, LogSink
from services.common.settings import RunnerSettings
from services.runner.app import trial_folders_root

EXECUTOR_SPEC = "benchmarks.instant_executor:from_settings"
"""The runner's ``executor`` setting that selects this executor."""


class InstantSettings(BaseSettings):
    """The instant executor's own settings (``TRIALBUS_INSTANT_*``)."""

    model_config = SettingsConfigDict(env_prefix="TRIALBUS_INSTANT_", extra="ignore", frozen=True)

    delay_s: float = Field(default=0.0, ge=0, description="How long each trial takes.")
    fail_with: str | None = Field(
        default=None, description="Fail every attempt with this Harbor exception name."
    )
    crash_with: str | None = Field(
        default=None,
        description="Raise RuntimeError(this) from every attempt: an executor's bug, not a "
        "trial's failure.",
    )
    hold_until: Path | None = Field(
        default=None,
        description="Each trial waits (after delay_s) until this file exists: a test holds "
        "every trial in flight for as long as it needs, whatever the machine's load.",
    )


@dataclass(eq=False)
class InstantExecutor:
    """An Executor that succeeds at once (or after ``delay_s``) with ``reward``; with
    ``fail_with`` every attempt fails with that Harbor exception name, and with
    ``hold_until`` every trial waits until that file exists. Trials go under
    ``jobs_root`` as Harbor's would. ``crash_with`` makes every run raise instead (a bug
    in an executor)."""

    name = "instant"
    version = "0"

    jobs_root: Path
    delay_s: float = 0.0
    reward: float = 1.0
    fail_with: str | None = None
    hold_until: Path | None = None
    crash_with: str | None = None
    _release: asyncio.Event | None = field(default=None, init=False)
    _watch: asyncio.Task[None] | None = field(default=None, init=False)
    _known_jobs: set[Path] = field(default_factory=set, init=False)

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        started = datetime.now(UTC)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.hold_until is not None:
            await self._released().wait()
        if self.crash_with:
            raise RuntimeError(self.crash_with)
        if self.fail_with:
            # Fault injection: an attempt that produced no result, with a Harbor
            # exception name (retry and scoring follow Harbor's error policy).
            return ExecutionOutcome(
                kind="failed", exception_type=self.fail_with, message="injected failure"
            )
        job_dir = job_dir_for(self.jobs_root, request.experiment_id)
        if job_dir not in self._known_jobs:
            ensure_job_dir(
                job_dir,
                experiment_id=request.experiment_id,
                name=request.experiment_id,
                job_config={"job_name": request.experiment_id},
            )
            self._known_jobs.add(job_dir)
        trial_dir = job_dir / request.trial_id
        (trial_dir / "verifier").mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC).isoformat()
        result = {
            "task_name": request.task.name,
            "trial_name": request.trial_id,
            "task_checksum": request.task.checksum,
            "config": {"job_id": str(job_uuid(request.experiment_id))},
            "agent_info": {
                "name": request.agent.agent_ref,
                "version": "0",
                "model_info": {"name": request.agent.model} if request.agent.model else None,
            },
            "verifier_result": {"rewards": {"reward": self.reward}},
            "exception_info": None,
            "started_at": started.isoformat(),
            "finished_at": now,
        }
        (trial_dir / "result.json").write_text(json.dumps(result))
        return ExecutionOutcome(kind="completed", trial_dir=trial_dir)

    def _released(self) -> asyncio.Event:
        """Set once ``hold_until`` exists; one watcher polls the file for every trial."""
        if self._release is None:
            self._release = asyncio.Event()
            self._watch = asyncio.create_task(self._wait_for_file(self._release))
        return self._release

    async def _wait_for_file(self, release: asyncio.Event) -> None:
        assert self.hold_until is not None
        while not self.hold_until.exists():  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.5)
        release.set()


def from_settings(settings: RunnerSettings) -> InstantExecutor:
    """Executor factory named by the runner's ``executor`` setting (``EXECUTOR_SPEC``)."""
    own = InstantSettings()
    return InstantExecutor(
        trial_folders_root(settings),
        delay_s=own.delay_s,
        fail_with=own.fail_with,
        hold_until=own.hold_until,
        crash_with=own.crash_with,
    )
