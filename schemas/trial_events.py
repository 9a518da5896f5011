"""Events of one trial: the work message, what its runner reports, and its import.

Import them from ``schemas.events``, which also holds the ``Event`` union and the codec.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.constraints import Count, FiniteAmount, PositiveCount
from schemas.documented import DOCUMENTED
from schemas.envelope import TRIAL_ID_PATTERN, RunEvent, TrialEvent, type_tag
from schemas.manifest import MAX_NAME_CHARS, MAX_REQUIRES, AgentSpec, ComputeSpec, RetrySpec
from schemas.objects import SHA256_PATTERN, ObjectRef
from schemas.runners import Capability, EnvName

MAX_MESSAGE_CHARS = 4000
"""Longest error message an event carries (runners cut Harbor's at 2,000)."""
_ATTEMPT = "Which start of this run this is, 1 for the first; counted per run by the runners."
_HANDED_BACK = (
    "How many starts of this run were handed back before this event without being "
    "counted as attempts (preempted by a higher priority class, or a runner's stop "
    "notice; docs/scheduling.md). 0, and left out of the wire form, for nearly every "
    "event; when set it keeps this start's dedup id apart from the handed-back one's."
)


def _handed_back_field() -> int:
    return Field(default=0, exclude_if=lambda v: not v, description=_HANDED_BACK)


def _left_out_when_none(**constraints: Any) -> Any:
    """An optional field that the wire form leaves out when it is None."""
    return Field(default=None, exclude_if=lambda v: v is None, **constraints)


TASK_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""A task's name is its folder's name on the runner: one safe path component."""

_TRIAL_NAME = (
    "Harbor's name of the trial folder (trial_id for trials trialbus ran; the "
    "folder's own name for external ones)."
)
_RESULT = (
    "The trial folder, packed (.tar.gz, services.common.archive) in the results "
    "bucket: result.json, verifier output, agent logs, artifacts."
)


class TaskRef(BaseModel):
    """A resolved Harbor task: its archive is in the tasks bucket under ``checksum``.

    Never a path: runners fetch the archive by checksum, verify it and unpack it into
    their own cache, so a runner needs no disk shared with the submitter.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    name: str = Field(pattern=TASK_NAME_PATTERN)
    """Task name (its folder's name)."""
    checksum: str = Field(pattern=SHA256_PATTERN)
    """sha256 over the task folder's relative paths and file contents at submit time; also the name
    of its archive in the tasks bucket."""


TEAM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$"
"""A team name, as the API tokens file allows it."""


class TeamRef(BaseModel):
    """The submitting team and the quotas runners enforce for it (docs/scheduling.md).

    Set by the submitter from the API token's identity, never from the manifest, and
    only when the team has a limit a runner enforces: a work message without it takes
    no team slot and reads no team spend. The limits are the ones at submit; runners
    apply the limits the submitter last published (control key ``quota.limits``)
    instead when there are some, so a changed quota reaches queued work.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    name: str = Field(pattern=TEAM_PATTERN)
    """The team (its API token's ``team``)."""
    max_concurrent_trials: PositiveCount | None = None
    """At most this many of the team's trials run at once across every runner (a team slot in the
    leases bucket). Absent: no team slot is taken."""
    max_spend_usd_per_day: FiniteAmount | None = None
    """The team's spend cap over the last 24 h (US dollars): runners add each attempt's cost to the
    team's tally and, once it is reached, hold the team's queued trials back unstarted. Absent: no
    team spend is tallied."""


class TrialRequested(RunEvent):
    """Work: run one trial. Published to the work stream with the run key as dedup id."""

    type: Literal["trial_requested"] = type_tag("trial_requested")
    task: TaskRef
    """The Harbor task to run, as the submitter resolved it."""
    agent: AgentSpec
    """The agent configuration from the manifest (secrets only by NAME)."""
    repetition: Count
    """0-based repetition index."""
    compute: ComputeSpec
    """Where and how the trial runs (from the manifest)."""
    retry: RetrySpec
    """How often and how soon a transient infrastructure failure is retried."""
    experiment_trials: PositiveCount | None = None
    """How many trials the submission expanded to. When it is at most compute.n_concurrent_trials
    the limit cannot bind, and runners take no concurrency slot for the trial. Absent: a slot is
    taken."""
    team: TeamRef | None = _left_out_when_none()
    """The submitting team and its quotas that runners enforce (a team concurrency slot, the daily
    spend cap), from the submitter's identity. Absent: no team quota applies on the runners."""
    task_variables: list[EnvName] | None = _left_out_when_none(max_length=256)
    """NAMES of the runner environment variables the task's task.toml requires (a ``${NAME}``
    without a default), as the submitter read them: a runner that lacks one hands the trial to a
    live runner of the pool that has it, like an agent's api_key_env (for a task given by checksum,
    and a retry, from the task's archive). Absent: none; the runner checks task.toml again either
    way."""

    task_requires: list[Capability] | None = _left_out_when_none(max_length=MAX_REQUIRES)
    """Capabilities a runner must offer for the task itself, beyond compute's, as the submitter
    read them from its task.toml (``local.allowlist``: a network allowlist under the local
    environment). A runner without one hands the trial to a live runner of the pool that offers
    it. Absent: none."""

    def needed_variables(self) -> list[str]:
        """Every variable a runner must have for this trial: the agent's, then the task's."""
        return list(dict.fromkeys([*self.agent.api_key_env, *(self.task_variables or ())]))

    def limit_binds(self) -> bool:
        """Whether the experiment's concurrency limit can bind (a slot is needed)."""
        n = self.experiment_trials
        return n is None or n > self.compute.n_concurrent_trials


class TrialStarted(RunEvent):
    """A runner began an attempt of a trial."""

    type: Literal["trial_started"] = type_tag("trial_started")
    runner_id: str
    """Id of the runner process (default: <host>-<pid>)."""
    host: str
    """Host name of the machine the runner runs on."""
    attempt: PositiveCount = Field(description=_ATTEMPT)
    handed_back: Count = _handed_back_field()
    task_name: str | None = _left_out_when_none(pattern=TASK_NAME_PATTERN)
    """The task being run (its work message's task name), so a live view names a running trial's
    task before its record exists. Absent from runners older than this field."""
    agent_label: str | None = _left_out_when_none(max_length=MAX_NAME_CHARS)
    """The agent as reports name it: the manifest's label, else its name or import path. Absent
    from runners older than this field."""
    model: str | None = _left_out_when_none(max_length=MAX_NAME_CHARS)
    """The model the agent runs with, when the manifest names one."""

    def _dedup_suffix(self) -> tuple[str, ...]:
        return ("started", str(self.attempt), *_handed_back_suffix(self.handed_back))


class TrialLog(TrialEvent):
    """A chunk of a running trial's output (logs stream)."""

    type: Literal["trial_log"] = type_tag("trial_log")
    phase: str
    """agent_setup | agent | verification"""
    stream: Literal["stdout", "stderr"]
    """Output stream the text came from."""
    text: str
    """The output chunk, decoded as UTF-8."""


class TrialCompleted(RunEvent):
    """Harbor finished a trial and wrote its result.json (which may record an error)."""

    type: Literal["trial_completed"] = type_tag("trial_completed")
    result: ObjectRef = Field(description=_RESULT)
    trial_name: str = Field(pattern=TRIAL_ID_PATTERN, description=_TRIAL_NAME)
    source: Literal["runner", "external"] = "runner"
    """'external': found by the watcher, not run by trialbus."""
    runner_host: str | None = None
    """Host of the runner that ran the trial (None: external)."""
    harbor_version: str | None = None
    """Version of Harbor that ran the trial, when known."""
    environment: str | None = None
    """Environment type/import path."""
    agent_label: str | None = None
    """The agent's display name in reports, when known."""
    attempt: PositiveCount = Field(default=1, description=_ATTEMPT)
    repetition: Count | None = None
    """The request's 0-based repetition index."""
    task: TaskRef | None = _left_out_when_none()
    """The request's task: its archive in the tasks bucket is exactly what ran (the record's
    provenance.task_archive). Absent for external trials and from runners older than this field."""

    def _dedup_suffix(self) -> tuple[str, ...]:
        return ("completed", str(self.attempt))


class TrialFailed(RunEvent):
    """A trial could not produce a Harbor result (or gave up after its retries)."""

    type: Literal["trial_failed"] = type_tag("trial_failed")
    failure_class: Literal["agent", "verifier", "infrastructure", "cancelled"]
    """What failed, by Harbor's error policy; only infrastructure is retried."""
    error_type: str = Field(max_length=200)
    """Exception class name ('UnknownError' when none)."""
    message: str = Field(max_length=MAX_MESSAGE_CHARS)
    """The exception's message (may be empty)."""
    attempt: PositiveCount = Field(description=_ATTEMPT)
    final: bool
    """False: the trial will be retried; True: it gives up."""
    result: ObjectRef | None = Field(
        default=None, description=_RESULT + " None when the attempt left no folder."
    )
    task: TaskRef | None = None
    """The request's task, so a record can be written from this."""
    agent: AgentSpec | None = None
    """The request's agent, so a record can be written from this."""
    repetition: Count | None = None
    """The request's 0-based repetition index."""
    runner_host: str | None = None
    """Host of the runner that made the attempt."""
    handed_back: Count = _handed_back_field()

    def _dedup_suffix(self) -> tuple[str, ...]:
        return (
            "failed",
            str(self.attempt),
            str(int(self.final)),
            *_handed_back_suffix(self.handed_back),
        )


def _handed_back_suffix(handed_back: int) -> tuple[str, ...]:
    # Nothing when 0: every event's dedup id is what it was before hand-backs existed.
    return (f"h{handed_back}",) if handed_back else ()


class ResultImported(TrialEvent):
    """The importer upserted a trial's record into the ledger."""

    type: Literal["result_imported"] = type_tag("result_imported")
    status: Literal["complete", "partial"]
    """The record's status: complete (result read in full) or partial (something missing or
    malformed; the record's errors say what)."""
    scored: bool
    """The record carries a valid reward."""
    main_reward: float | None = None
    """The record's main reward (None when it has none)."""
    changed: bool
    """False when the ledger already held this record."""

    def dedup_id(self) -> str:
        """Keyed by event id: every import is its own message, even of the same record."""
        return f"{self.trial_id}:imported:{self.event_id}"
