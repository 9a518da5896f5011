"""Builders shared by the runner's unit tests: work requests and a scripted Executor."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from schemas.events import TaskRef, TrialRequested
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.ports import ExecutionOutcome, LogSink
from services.common.trial_folders import TrialFolders


def make_request(
    trial_id: str = "hello__0001",
    *,
    experiment_id: str = "exp-1",
    limit: int = 2,
    max_attempts: int = 3,
    backoff_s: float = 2.0,
    max_backoff_s: float = 60.0,
    experiment_trials: int | None = None,
) -> TrialRequested:
    """A work message as the submitter publishes it."""
    return TrialRequested(
        experiment_id=experiment_id,
        correlation_id="corr-1",
        trial_id=trial_id,
        task=TaskRef(name="hello", checksum="ab" * 32),
        agent=AgentSpec(name="oracle"),
        repetition=0,
        compute=ComputeSpec(environment="docker", n_concurrent_trials=limit),
        retry=RetrySpec(
            max_attempts=max_attempts,
            backoff_seconds=backoff_s,
            max_backoff_seconds=max_backoff_s,
        ),
        experiment_trials=experiment_trials,
    )


def completed(
    tmp: Path, trial_id: str = "hello__0001", error: str | None = None
) -> ExecutionOutcome:
    """Harbor wrote result.json (possibly recording ``error``)."""
    trial_dir = tmp / "job" / trial_id
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "result.json").write_text(json.dumps({"trial_name": trial_id}))
    return ExecutionOutcome(
        kind="completed",
        trial_dir=trial_dir,
        exception_type=error,
        message=f"{error} happened" if error else None,
    )


def failed(error: str | None) -> ExecutionOutcome:
    """No result.json came out of the attempt."""
    return ExecutionOutcome(kind="failed", exception_type=error, message="no result")


def trial_folders() -> TrialFolders:
    """Trial folders stored in memory, uploaded at once (no retry pauses)."""
    return TrialFolders(InMemoryObjectStore("RESULTS"), cap_bytes=1 << 20, retry_delays_s=())


Script = Callable[[TrialRequested, int], ExecutionOutcome]


class ScriptedExecutor:
    """An Executor whose outcome per call is given by ``script``; records every call.

    With ``block`` set, each run waits on ``release`` (so a test can act while the
    trial runs) and sets ``running`` once it started.
    """

    name = "scripted"
    version = "9.9.9"

    def __init__(self, script: Script, *, block: bool = False) -> None:
        self._script = script
        self._block = block
        self.calls: list[tuple[str, int, LogSink | None]] = []
        self.running = asyncio.Event()
        self.release = asyncio.Event()
        self.was_cancelled = False

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Record the call, optionally wait, then return the scripted outcome."""
        self.calls.append((request.trial_id, attempt, on_log))
        self.running.set()
        if self._block:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.was_cancelled = True
                raise
        return self._script(request, attempt)


def held_completion(tmp: Path) -> ScriptedExecutor:
    """An executor whose trials wait for ``release``, then complete (result.json in ``tmp``)."""
    return ScriptedExecutor(lambda r, a: completed(tmp, r.trial_id), block=True)
