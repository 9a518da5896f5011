"""The local environment's exceptions, and how trialbus classifies each one.

Harbor records a failed trial by the *name* of the exception's class
(``ExceptionInfo.exception_type``); ``services.common.failures`` maps names to a
failure class and a retry decision. Every class below but ``DiskQuotaExceededError``
is an environment failure (``infrastructure``: unscored, never an agent failure, never
a zero reward).

==============================  ===========  ==========================================
class                           retried      raised when
==============================  ===========  ==========================================
LocalEnvironmentError           no           the sandbox cannot be set up on this host
                                             (bubblewrap missing, bad path, ...)
UnsupportedEnvironmentError     no           the task asks for what cannot be imitated:
                                             unknown base image, multi-stage build,
                                             docker compose, ADD from a URL, ...
DockerfileBuildError            no           a Dockerfile step (RUN, COPY) failed, as a
                                             ``docker build`` would; the build log is
                                             attached
SandboxStartError               yes          the sandbox processes failed to come up
                                             (transient: resources, a killed helper)
ExecTimeoutError                (Harbor's)   one command exceeded its timeout
DiskQuotaExceededError          no           the trial wrote past its disk quota: the
                                             one *agent* failure here (like Harbor's
                                             AgentTimeoutError: a spent budget)
==============================  ===========  ==========================================

The "not retried" names are listed in ``NOT_RETRYABLE_TRIALBUS``: they fail the same
way on every attempt. A RUN step that failed for a transient reason (a registry
hiccup) is re-run by resubmitting the experiment, which re-runs unscored trials.
"""

from __future__ import annotations

from pathlib import Path


class LocalEnvironmentError(RuntimeError):
    """The sandbox could not be set up or used (an environment error, never the agent's)."""


class UnsupportedEnvironmentError(LocalEnvironmentError):
    """The task's environment asks for something the local environment cannot imitate."""


class DockerfileBuildError(LocalEnvironmentError):
    """A Dockerfile step failed while building the task's layer (like a failed docker build).

    ``log_path`` is the full build log; the message carries its last lines.
    """

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


class SandboxStartError(RuntimeError):
    """The sandbox's processes did not come up (transient; a new attempt may work)."""


class ExecTimeoutError(RuntimeError):
    """A command exceeded its timeout and was killed with its whole process tree."""


class DiskQuotaExceededError(RuntimeError):
    """The trial wrote more than its disk quota; the trial was ended (the agent's doing)."""
