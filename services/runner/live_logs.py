"""Live trial output over core NATS: the runner's LogSink adapter, redacted and bounded.

Live logs are best effort: a core (not JetStream-acknowledged) publish into the logs
stream, so a lost line never slows or fails a trial. The full logs stay in the Harbor
job folder.

Two rules hold before anything is published (docs/security.md, "Live logs"):

- Redacted: every value of a secret the trial may see (the variables its agent's
  ``api_key_env`` names, as the runner's environment holds them, and the runner's own
  credentials) is replaced by ``[redacted:NAME]``, also when split between chunks
  (services.common.redaction). A trial one of whose secrets is too short to search for
  (under 8 characters) publishes no output at all, only a notice saying why.
- Bounded: at most ``LogLimits.trial_bytes`` bytes of text per attempt, in events of at
  most ``LogLimits.event_chars`` characters (a longer chunk is split, not cut). Past
  the cap, one notice says so at once and, when the output ends (``close``), another
  says how many bytes were not published: output is never dropped silently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from schemas.events import TrialLog, TrialRequested
from schemas.subjects import Topology
from services.common.redaction import MIN_SECRET_CHARS, RedactingStream, Redactor, TrialSecrets
from services.common.settings import RunnerSettings

CorePublish = Callable[[str, bytes], Awaitable[None]]
"""Core NATS publish (subject, payload): fire-and-forget."""

MAX_TEXT = 16_000
"""Default characters per event: at most 64 KB of UTF-8, far below NATS's payload cap."""
MAX_TRIAL_BYTES = 1 << 20
"""Default bytes of published text per attempt (1 MiB)."""
NOTICE_STREAM = "stderr"


@dataclass(frozen=True, slots=True)
class LogLimits:
    """How much live output one attempt may publish (RunnerSettings.log_* fields)."""

    trial_bytes: int = MAX_TRIAL_BYTES
    event_chars: int = MAX_TEXT


@runtime_checkable
class ClosableLogSink(Protocol):
    """A LogSink that must be told when the trial's output has ended."""

    async def __call__(self, phase: str, stream: str, text: str) -> None:
        """Take one chunk of output."""

    async def close(self) -> None:
        """The output has ended: publish what was kept back, and the dropped count."""


@dataclass(eq=False)
class TrialLogSink:
    """One attempt's live output: redact, split, bound, publish (see the module doc)."""

    publish: CorePublish
    subject: str
    request: TrialRequested
    # Kept out of repr: the redactor holds the values of the trial's secrets.
    redactor: Redactor = field(repr=False)
    limits: LogLimits
    published_bytes: int = field(init=False, default=0)
    dropped_bytes: int = field(init=False, default=0)
    _streams: dict[tuple[str, str], RedactingStream] = field(init=False, default_factory=dict)
    _phase: str = field(init=False, default="agent")
    _left: int = field(init=False)
    _withheld: bool = field(init=False)
    _noticed: bool = field(init=False, default=False)
    _closed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._left = self.limits.trial_bytes
        self._withheld = bool(self.redactor.too_short)

    async def __call__(self, phase: str, stream: str, text: str) -> None:
        """Take one chunk of the trial's output (phase, stdout or stderr, text)."""
        stream = "stderr" if stream == "stderr" else "stdout"
        # Lone surrogates (undecodable bytes) would make the event unencodable.
        text = text.encode(errors="replace").decode()
        if self._closed:
            return
        if phase != self._phase:
            # A new phase: the previous phase's output is complete.
            for key in [k for k in self._streams if k[0] != phase]:
                await self._emit(key[0], key[1], self._streams.pop(key).flush())
            self._phase = phase
        if self._withheld or self._left <= 0:
            await self._drop(len(text.encode()))
            return
        redacting = self._streams.get((phase, stream))
        if redacting is None:
            redacting = self._streams[(phase, stream)] = self.redactor.stream()
        await self._emit(phase, stream, redacting.feed(text))

    async def close(self) -> None:
        """The output has ended: release what redaction kept back, report any drop."""
        if self._closed:
            return
        for (phase, stream), redacting in list(self._streams.items()):
            await self._emit(phase, stream, redacting.flush())
        self._streams.clear()
        self._closed = True
        if self.dropped_bytes:
            await self._send(
                self._phase,
                NOTICE_STREAM,
                f"[trialbus: {self.dropped_bytes} bytes of this trial's output were not "
                f"published as live logs ({self._why()}); the trial folder keeps them]",
            )

    def _why(self) -> str:
        if self._withheld:
            return (
                f"secret {', '.join(self.redactor.too_short)} is shorter than "
                f"{MIN_SECRET_CHARS} characters and cannot be redacted"
            )
        return f"live-log cap of {self.limits.trial_bytes} bytes per trial reached"

    async def _drop(self, n: int) -> None:
        self.dropped_bytes += n
        if not self._noticed:
            self._noticed = True
            await self._send(
                self._phase,
                NOTICE_STREAM,
                f"[trialbus: further output of this trial is not published as live logs "
                f"({self._why()}); the count follows when the trial ends]",
            )

    async def _emit(self, phase: str, stream: str, text: str) -> None:
        """Publish redacted ``text`` in events of at most ``event_chars``, within budget."""
        size = self.limits.event_chars
        for at in range(0, len(text), size):
            piece = text[at : at + size]
            data = piece.encode()
            if self._left <= 0:
                await self._drop(len(data) + len(text[at + size :].encode()))
                return
            if len(data) > self._left:
                fits = data[: self._left].decode(errors="ignore")  # whole characters only
                rest = len(data) - len(fits.encode()) + len(text[at + size :].encode())
                self._left = 0
                self.published_bytes += len(fits.encode())
                await self._send(phase, stream, fits)
                await self._drop(rest)
                return
            self._left -= len(data)
            self.published_bytes += len(data)
            await self._send(phase, stream, piece)

    async def _send(self, phase: str, stream: str, text: str) -> None:
        if not text:
            return
        event = TrialLog(
            experiment_id=self.request.experiment_id,
            trial_id=self.request.trial_id,
            correlation_id=self.request.correlation_id,
            phase=phase,
            stream="stderr" if stream == "stderr" else "stdout",
            text=text,
        )
        with contextlib.suppress(Exception):
            await self.publish(self.subject, event.model_dump_json().encode())


class CoreNatsLogSinks:
    """Builds, per trial attempt, the TrialLogSink that publishes its output."""

    def __init__(
        self,
        publish: CorePublish,
        topology: Topology,
        *,
        limits: LogLimits | None = None,
        runner_secrets: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """``runner_secrets``: the runner's own credentials (redaction.runner_secrets).
        ``environ``: the environment trials inherit (default: this process's, which
        the trial processes are forked with; services.runner.isolation)."""
        self._publish = publish
        self._topology = topology
        self._limits = limits or LogLimits()
        self._secrets = TrialSecrets(dict(runner_secrets or {}), environ)

    @classmethod
    def from_settings(
        cls,
        publish: CorePublish,
        settings: RunnerSettings,
        environ: Mapping[str, str] | None = None,
    ) -> CoreNatsLogSinks:
        """The sinks a runner configured by ``settings`` uses (its limits, its secrets)."""
        secrets = TrialSecrets.from_settings(settings, environ)
        return cls(
            publish,
            settings.topology,
            limits=LogLimits(settings.live_log_trial_bytes, settings.live_log_event_chars),
            runner_secrets=secrets.runner,
            environ=secrets.environ,
        )

    def secrets_of(self, request: TrialRequested) -> dict[str, str]:
        """Name -> value of every secret ``request``'s trial may see."""
        return self._secrets.of(request)

    def __call__(self, request: TrialRequested) -> TrialLogSink:
        """The sink of ``request``'s trial (one per attempt)."""
        subject = self._topology.log_subject(request.experiment_id, request.trial_id)
        redactor = self._secrets.redactor(request)
        return TrialLogSink(self._publish, subject, request, redactor, self._limits)
