"""The Executor port: runs one trial. HarborExecutor is the real one; a benchmark
executor (services.runner.instant) replaces it to measure the pipeline alone."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from schemas.events import TrialRequested

LogSink = Callable[[str, str, str], Awaitable[None]]
"""(phase, stream, text) -> None: receives live output of a running trial."""


@dataclass(frozen=True, slots=True)
class ExecutionOutcome:
    """What became of one attempt.

    ``completed``: Harbor wrote result.json in ``trial_dir`` (it may record an error,
    named by ``exception_type``). ``failed``: no result could be produced.
    """

    kind: Literal["completed", "failed"]
    trial_dir: Path | None = None
    job_dir: Path | None = None
    exception_type: str | None = None
    message: str | None = None


class Executor(Protocol):
    """Runs trials. Implementations must be safe to call concurrently."""

    name: str
    version: str

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Run one attempt of a trial to the end (cancellation stops it)."""
