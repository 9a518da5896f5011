"""Stream and subject names, defined once.

Every service derives its names from a :class:`Topology`, so tests (and several
trialbus installations sharing one NATS cluster) isolate themselves by choosing a
different ``prefix``. Nothing else in the code base spells a subject by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import overload

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

POOL_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
"""What a pool name may be: it is a subject token and part of a durable's name."""
_POOL_RE = re.compile(POOL_PATTERN)

DEFAULT_POOL = "default"
"""The pool of a manifest that names none, and of a runner configured with none."""


CLASS_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
"""What a priority class name may be: a subject token and part of a durable's name."""
_CLASS_RE = re.compile(CLASS_PATTERN)

_DURABLE_TOKEN_RULE = (
    "lowercase letters, digits and '-', starting with a letter, at most 32 characters"
)
"""The rule of POOL_PATTERN and CLASS_PATTERN in words, for their errors."""


def checked_token(value: str, pattern: re.Pattern[str], what: str, rule: str) -> str:
    """Return ``value``, or raise ValueError saying that ``what`` must match ``pattern``
    and, in words, the ``rule``: every name that becomes a subject token is checked so."""
    if not pattern.match(value):
        raise ValueError(f"{what} {value!r} must match {pattern.pattern} ({rule})")
    return value


def check_class(name: str) -> str:
    """Return ``name``, or raise ValueError naming the rule a priority class breaks."""
    return checked_token(name, _CLASS_RE, "priority class", _DURABLE_TOKEN_RULE)


def check_pool(pool: str) -> str:
    """Return ``pool``, or raise ValueError naming the rule it breaks."""
    return checked_token(pool, _POOL_RE, "runner pool", _DURABLE_TOKEN_RULE)


class _Name:
    """A fixed name of a :class:`Topology`, read as an attribute: ``template`` filled
    with the topology's ``{prefix}`` and ``{base}``, the prefix upper-cased with '_'
    for '-' (stream and bucket names: NATS stream names take no '-')."""

    def __init__(self, template: str) -> None:
        self.template = template

    @overload
    def __get__(self, topology: None, owner: type[Topology]) -> _Name: ...
    @overload
    def __get__(self, topology: Topology, owner: type[Topology]) -> str: ...
    def __get__(self, topology: Topology | None, owner: type[Topology]) -> _Name | str:
        if topology is None:
            return self
        base = topology.prefix.upper().replace("-", "_")
        return self.template.format(prefix=topology.prefix, base=base)


@dataclass(frozen=True, slots=True)
class Topology:
    """Names of the JetStream streams, subjects and durable consumers.

    Streams:
    - ``work``: TrialRequested messages, work-queue retention, one subject per pool
      and priority class: ``<prefix>.work.<pool>.<experiment_id>`` for a manifest
      that names no class (the installation's default class, and the only form
      before classes existed), ``<prefix>.work.<pool>.<class>.<experiment_id>`` for
      one that does. The runners of a pool share one durable pull consumer per
      class, so each trial is handed to exactly one runner of the pool the manifest
      asked for. A work-queue stream refuses overlapping consumer filters, which is
      why no durable takes ``work.>`` or ``work.<pool>.>`` (docs/scheduling.md).
    - ``events``: lifecycle events (ExperimentSubmitted, TrialStarted, ...), limits
      retention; any number of consumers may follow it.
    - ``logs``: live trial output lines, limits retention with a max age.
    """

    prefix: str = "trialbus"

    def __post_init__(self) -> None:
        checked_token(
            self.prefix,
            _PREFIX_RE,
            "topology prefix",
            "lowercase letters, digits, '-' or '_', at most 32 characters",
        )

    # -- streams -----------------------------------------------------------------
    work_stream = _Name("{base}_WORK")
    events_stream = _Name("{base}_EVENTS")
    logs_stream = _Name("{base}_LOGS")

    # -- key-value and object store buckets ----------------------------------------
    # NATS names a bucket's backing stream KV_<bucket> / OBJ_<bucket>; permissions
    # (one NATS user per role) are granted per bucket, so every name is spelled here.
    leases_bucket = _Name("{base}_LEASES")
    """KV: experiment concurrency leases (TTL = the runners' ack_wait)."""
    control_bucket = _Name("{base}_CONTROL")
    """KV: cancel flags and attempt counters."""
    runners_bucket = _Name("{base}_RUNNERS")
    """KV: one heartbeat record per runner process (pool, capabilities), with a TTL."""
    tasks_bucket = _Name("{base}_TASKS")
    """Object store: task archives, named by the task's content checksum."""
    results_bucket = _Name("{base}_RESULTS")
    """Object store: finished trial folders, named by run."""

    # -- subjects ----------------------------------------------------------------
    def work_subject(
        self, experiment_id: str, pool: str = DEFAULT_POOL, priority_class: str | None = None
    ) -> str:
        """Subject of one experiment's TrialRequested messages for runners of ``pool``,
        in ``priority_class`` (None: the installation's default class)."""
        base = f"{self.prefix}.work.{check_pool(pool)}"
        if priority_class is None:
            return f"{base}.{experiment_id}"
        return f"{base}.{check_class(priority_class)}.{experiment_id}"

    def work_pool_filter(self, pool: str = DEFAULT_POOL) -> str:
        """Every work subject of ``pool`` (every class): for counting, never a durable's
        filter (it would overlap the class durables')."""
        return f"{self.prefix}.work.{check_pool(pool)}.>"

    def work_class_filters(
        self, pool: str, priority_class: str, *, default: bool
    ) -> tuple[str, ...]:
        """The filters of the durable of (``pool``, ``priority_class``): the class's
        subjects, and for the ``default`` class also the unclassed ones."""
        named = f"{self.prefix}.work.{check_pool(pool)}.{check_class(priority_class)}.*"
        return (f"{self.prefix}.work.{pool}.*", named) if default else (named,)

    def parse_work_subject(self, subject: str) -> tuple[str, str | None, str] | None:
        """(pool, class or None for an unclassed subject, experiment) of a work
        subject; None for a subject of another form."""
        head = f"{self.prefix}.work."
        if not subject.startswith(head):
            return None
        parts = subject[len(head) :].split(".")
        if len(parts) == 2:
            return parts[0], None, parts[1]
        if len(parts) == 3:
            return parts[0], parts[1], parts[2]
        return None

    work_wildcard = _Name("{prefix}.work.>")
    """Every work subject of every pool: the work stream's subjects."""

    def event_subject(self, event_type: str, experiment_id: str) -> str:
        """Subject of one event: ``<prefix>.events.<type>.<experiment_id>``."""
        return f"{self.prefix}.events.{event_type}.{experiment_id}"

    def event_filter(self, event_type: str = "*", experiment_id: str = "*") -> str:
        return f"{self.prefix}.events.{event_type}.{experiment_id}"

    events_wildcard = _Name("{prefix}.events.>")

    def log_subject(self, experiment_id: str, trial_id: str) -> str:
        return f"{self.prefix}.logs.{experiment_id}.{trial_id}"

    logs_wildcard = _Name("{prefix}.logs.>")

    # -- durable consumers -------------------------------------------------------
    runner_durable = _Name("{prefix}-runners")
    """The default pool's durable (the name it had before pools existed)."""

    def runner_durable_for(
        self, pool: str = DEFAULT_POOL, priority_class: str | None = None
    ) -> str:
        """Durable pull consumer shared by the runners of ``pool`` for ``priority_class``.

        The default class (None) keeps the pool's name from before classes existed;
        another class appends ``_<class>`` (pools and classes have no ``_``, so the
        names of (pool, class) pairs never collide).
        """
        base = (
            self.runner_durable
            if check_pool(pool) == DEFAULT_POOL
            else f"{self.prefix}-runners-{pool}"
        )
        return base if priority_class is None else f"{base}_{check_class(priority_class)}"

    importer_durable = _Name("{prefix}-importer")
    watcher_durable = _Name("{prefix}-watcher")
