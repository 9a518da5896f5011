"""Stream and subject names, defined once.

Every service derives its names from a :class:`Topology`, so tests (and several
trialbus installations sharing one NATS cluster) isolate themselves by choosing a
different ``prefix``. Nothing else in the code base spells a subject by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


@dataclass(frozen=True, slots=True)
class Topology:
    """Names of the JetStream streams, subjects and durable consumers.

    Streams:
    - ``work``: TrialRequested messages, work-queue retention; every runner shares
      one durable pull consumer, so each trial is handed to exactly one runner.
    - ``events``: lifecycle events (ExperimentSubmitted, TrialStarted, ...), limits
      retention; any number of consumers may follow it.
    - ``logs``: live trial output lines, limits retention with a max age.
    """

    prefix: str = "trialbus"

    def __post_init__(self) -> None:
        if not _PREFIX_RE.match(self.prefix):
            raise ValueError(
                f"topology prefix {self.prefix!r} must match {_PREFIX_RE.pattern} "
                "(lowercase letters, digits, '-' or '_', at most 32 characters)"
            )

    # -- streams -----------------------------------------------------------------
    @property
    def _stream_base(self) -> str:
        return self.prefix.upper().replace("-", "_")

    @property
    def work_stream(self) -> str:
        return f"{self._stream_base}_WORK"

    @property
    def events_stream(self) -> str:
        return f"{self._stream_base}_EVENTS"

    @property
    def logs_stream(self) -> str:
        return f"{self._stream_base}_LOGS"

    # -- key-value and object store buckets ----------------------------------------
    # NATS names a bucket's backing stream KV_<bucket> / OBJ_<bucket>; permissions
    # (one NATS user per role) are granted per bucket, so every name is spelled here.
    @property
    def leases_bucket(self) -> str:
        """KV: experiment concurrency leases (TTL = the runners' ack_wait)."""
        return f"{self._stream_base}_LEASES"

    @property
    def control_bucket(self) -> str:
        """KV: cancel flags and attempt counters."""
        return f"{self._stream_base}_CONTROL"

    @property
    def runners_bucket(self) -> str:
        """KV: one heartbeat record per runner process (pool, capabilities), with a TTL."""
        return f"{self._stream_base}_RUNNERS"

    @property
    def tasks_bucket(self) -> str:
        """Object store: task archives, named by the task's content checksum."""
        return f"{self._stream_base}_TASKS"

    @property
    def results_bucket(self) -> str:
        """Object store: finished trial folders, named by run."""
        return f"{self._stream_base}_RESULTS"

    # -- subjects ----------------------------------------------------------------
    def work_subject(self, experiment_id: str) -> str:
        """Subject of one experiment's TrialRequested messages."""
        return f"{self.prefix}.work.{experiment_id}"

    @property
    def work_wildcard(self) -> str:
        return f"{self.prefix}.work.>"

    def event_subject(self, event_type: str, experiment_id: str) -> str:
        """Subject of one event: ``<prefix>.events.<type>.<experiment_id>``."""
        return f"{self.prefix}.events.{event_type}.{experiment_id}"

    def event_filter(self, event_type: str = "*", experiment_id: str = "*") -> str:
        return f"{self.prefix}.events.{event_type}.{experiment_id}"

    @property
    def events_wildcard(self) -> str:
        return f"{self.prefix}.events.>"

    def log_subject(self, experiment_id: str, trial_id: str) -> str:
        return f"{self.prefix}.logs.{experiment_id}.{trial_id}"

    @property
    def logs_wildcard(self) -> str:
        return f"{self.prefix}.logs.>"

    # -- durable consumers -------------------------------------------------------
    @property
    def runner_durable(self) -> str:
        return f"{self.prefix}-runners"

    @property
    def importer_durable(self) -> str:
        return f"{self.prefix}-importer"

    @property
    def watcher_durable(self) -> str:
        return f"{self.prefix}-watcher"
