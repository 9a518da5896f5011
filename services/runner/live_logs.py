"""Live trial output over core NATS: the runner's LogSink adapter.

Live logs are best effort: a core (not JetStream-acknowledged) publish into the logs
stream, so a lost line never slows or fails a trial. The full logs stay in the Harbor
job folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from schemas.events import TrialLog, TrialRequested
from schemas.subjects import Topology
from services.common.ports import LogSink

CorePublish = Callable[[str, bytes], Awaitable[None]]
"""Core NATS publish (subject, payload): fire-and-forget."""

MAX_TEXT = 16_000


class CoreNatsLogSinks:
    """Builds, per trial, a LogSink that publishes each chunk as a TrialLog."""

    def __init__(self, publish: CorePublish, topology: Topology) -> None:
        self._publish = publish
        self._topology = topology

    def __call__(self, request: TrialRequested) -> LogSink:
        """The sink of ``request``'s trial."""
        publish = self._publish
        subject = self._topology.log_subject(request.experiment_id, request.trial_id)

        async def sink(phase: str, stream: str, text: str) -> None:
            event = TrialLog(
                experiment_id=request.experiment_id,
                trial_id=request.trial_id,
                correlation_id=request.correlation_id,
                phase=phase,
                stream="stderr" if stream == "stderr" else "stdout",
                text=text[:MAX_TEXT],
            )
            with contextlib.suppress(Exception):
                await publish(subject, event.model_dump_json().encode())

        return sink
