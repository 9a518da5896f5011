"""What waits, and why: the rows of ``trialbus queue``, ``GET /queue`` and ``/ui/queue``.

Pure: counts and flags in, rows out (services/submitter/follow.read_queue reads them).
The counts are the work stream's messages per subject and the leases bucket's keys
per experiment, never one read per queued trial. A work-queue stream keeps a message
until a runner acknowledges it, so a subject's count is the experiment's trials queued
plus those running; every running trial holds one lease of its experiment
(services/runner/admission.py), so queued = messages - leases.

Why an experiment's queued trials wait, the first that holds:

1. ``paused``: its pause flag is set (the control bucket, docs/scheduling.md), or
   every trial it has queued may be one paused on its own (as many unfinished trials
   of it are paused one by one as it has queued);
2. ``team_spend_cap``: its team (the manifest's ``submitted_by.team``) has spent its
   ``max_spend_usd_per_day`` in the last 24 h (the quotas file and the team's spend
   tally, docs/scheduling.md): runners hand its trials back without pausing anything;
3. ``no_runner``: no live runner of its pool offers what it needs (the registry,
   services/common/pools.pool_refusal: its words);
4. ``concurrency_limit``: as many trials run as its ``n_concurrent_trials`` allows
   (its leases);
5. ``over_share``: its team (``share.<experiment>``, what runners judge by) runs more
   trials per share in its pool and class than another team that waits there
   (services/common/fair_share.py, from the same counts as runners: the work
   subjects' messages and the share marks);
6. ``priority``: none of these: it waits behind other work of its pool (the
   runners take classes by weight, docs/scheduling.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from schemas.manifest import ComputeSpec
from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.fair_share import TeamShare, held_back, marks_by_class, waiting
from services.common.pools import pool_refusal
from services.common.ports import ExperimentInfo
from services.common.priority import PriorityClasses
from services.common.quotas import Quotas, team_key
from services.submitter.api_tokens import owner_from_record

REASONS = (
    "paused",
    "team_spend_cap",
    "no_runner",
    "concurrency_limit",
    "over_share",
    "priority",
)
"""Why queued trials wait, in the order they are checked."""


@dataclass(frozen=True, slots=True)
class WaitingExperiment:
    """One experiment's queued trials on one work subject, and why they wait."""

    experiment_id: str
    name: str
    pool: str
    priority_class: str
    """The class its trials are queued in (the default class when the manifest names none)."""
    team: str | None
    user: str | None
    queued: int
    running: int
    n_concurrent_trials: int | None
    """Its ``compute.n_concurrent_trials`` (None: the ledger does not know the experiment)."""
    paused_trials: int
    """Its unfinished trials paused one by one (``trialbus pause EXP --trial T``)."""
    reason: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``trialbus queue --json``, ``GET /queue``): the fields as they are."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueGroup:
    """What waits in one (pool, class, team): counts, and queued trials by reason."""

    pool: str
    priority_class: str
    team: str | None
    queued: int
    running: int
    experiments: int
    by_reason: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON form: the fields as they are (``by_reason`` copied)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueView:
    """The whole queue: per (pool, class, team) groups, and the experiments in them."""

    groups: list[QueueGroup]
    experiments: list[WaitingExperiment]

    @property
    def queued(self) -> int:
        """Trials queued in all."""
        return sum(e.queued for e in self.experiments)

    def as_dict(self) -> dict[str, Any]:
        """JSON form: ``{queued, groups: [...], experiments: [...]}``."""
        return {
            "queued": self.queued,
            "groups": [g.as_dict() for g in self.groups],
            "experiments": [e.as_dict() for e in self.experiments],
        }


def parse_work_subject(topology: Topology, subject: str) -> tuple[str, str | None, str] | None:
    """(pool, class or None for an unclassed subject, experiment) of a work subject;
    None for a subject of another form (``Topology.parse_work_subject``)."""
    return topology.parse_work_subject(subject)


def lease_counts(leases_bucket: str, subjects: Mapping[str, int]) -> dict[str, int]:
    """Leases held per experiment, from the leases stream's subjects
    ``$KV.<bucket>.<experiment>.<slot>`` (a released lease leaves no message)."""
    head = f"$KV.{leases_bucket}."
    held: dict[str, int] = {}
    for subject, n in subjects.items():
        if subject.startswith(head) and n > 0:
            experiment = subject[len(head) :].rsplit(".", 1)[0]
            held[experiment] = held.get(experiment, 0) + 1
    return held


def _compute(info: ExperimentInfo | None, pool: str) -> ComputeSpec:
    raw = info.manifest.get("compute") if info else None
    try:
        return ComputeSpec.model_validate({**(raw if isinstance(raw, dict) else {}), "pool": pool})
    except ValidationError:  # a manifest this release cannot read: judge by the pool alone
        return ComputeSpec(pool=pool)


def capped_teams(quotas: Quotas, spent: Mapping[str, float]) -> dict[str, str]:
    """Team -> words, for each team in ``spent`` (its rolling 24-h spend tally) whose
    ``max_spend_usd_per_day`` it has reached, as runners judge it
    (services/runner/guards.team_capped)."""
    capped: dict[str, str] = {}
    for team, amount in spent.items():
        quota = quotas.for_team(team)
        cap = quota.max_spend_usd_per_day if quota else None
        if cap is not None and amount >= cap:
            capped[team] = (
                f"team {team!r} reached its max_spend_usd_per_day: ${amount:.4f} of "
                f"${cap:g} spent in the last 24 h; runners hold its trials back until "
                "the window moves on or an operator raises the cap (TRIALBUS_QUOTAS_FILE)"
            )
    return capped


def why_waiting(
    *,
    paused: bool,
    refusal: str | None,
    running: int,
    limit: int | None,
    experiment_id: str,
    queued: int = 0,
    paused_trials: int = 0,
    team_capped: str | None = None,
    over_share: str | None = None,
) -> tuple[str, str]:
    """(reason, words) for an experiment's ``queued`` trials (the module's order);
    ``team_capped``: the words of ``capped_teams`` when its team is at its spend cap;
    ``over_share``: fair share's words when its team is held back (``share_judge``)."""
    if paused:
        return "paused", f"paused: its trials wait for `trialbus resume {experiment_id}`"
    if paused_trials and queued <= paused_trials:
        return "paused", (
            f"{paused_trials} of its trials paused one by one: each waits for "
            f"`trialbus resume {experiment_id} --trial TRIAL`"
        )
    if team_capped is not None:
        return "team_spend_cap", team_capped
    if refusal is not None:
        return "no_runner", refusal
    if limit is not None and running >= limit:
        return "concurrency_limit", (
            f"{running} of its n_concurrent_trials {limit} are running; the next starts "
            "when one ends"
        )
    if over_share is not None:
        return "over_share", over_share
    return "priority", "waits its turn behind other work of its pool (classes by weight)"


ShareJudge = Callable[[str, str, str], str | None]
"""(pool, class, experiment) -> fair share's words when the experiment's team is held
back there, else None (``share_judge``)."""


def share_judge(
    topology: Topology,
    classes: PriorityClasses,
    work: Mapping[str, int],
    shares: Mapping[str, TeamShare | None],
    paused: Mapping[str, bool],
    marks: Mapping[str, int],
) -> ShareJudge:
    """Fair share as runners judge it (services/runner/fair_share.py), from the work
    subjects' messages, each experiment's team and share (``shares``), the pause flags
    and the share marks of the leases bucket (keys relative to the bucket)."""
    messages: dict[tuple[str, str], dict[str, int]] = {}
    team_shares: dict[str, float] = {}
    for subject, n in work.items():
        parsed = topology.parse_work_subject(subject)
        team = shares.get(parsed[2]) if parsed else None
        if parsed is None or team is None or n <= 0 or paused.get(parsed[2], False):
            continue
        per_team = messages.setdefault((parsed[0], classes.resolve(parsed[1])), {})
        per_team[team.team] = per_team.get(team.team, 0) + n
        team_shares[team.team] = team.share
    running_of = {pool: marks_by_class(marks, pool) for pool, _ in messages}

    def judge(pool: str, cls: str, experiment_id: str) -> str | None:
        team = shares.get(experiment_id)
        msgs = messages.get((pool, cls), {})
        if team is None:
            return None
        marked = running_of.get(pool, {})
        running = {t: marked.get((cls, team_key(t)), 0) for t in {team.team, *msgs}}
        rivals = {t: team_shares[t] for t in waiting(msgs, running)}
        return held_back(team.team, team.share, running, rivals)

    return judge


def queue_view(
    topology: Topology,
    classes: PriorityClasses,
    work: Mapping[str, int],
    leases: Mapping[str, int],
    infos: Mapping[str, ExperimentInfo | None],
    paused: Mapping[str, bool],
    runners: Sequence[RunnerInfo],
    paused_trials: Mapping[str, int] | None = None,
    capped: Mapping[str, str] | None = None,
    over_share: ShareJudge | None = None,
) -> QueueView:
    """The queue from ``work`` (messages per work subject), ``leases`` (per experiment,
    ``lease_counts``), the ledger's ``infos``, the ``paused`` flags and the number of
    ``paused_trials`` (unfinished, paused one by one) of the experiments in ``work``,
    the live ``runners``, the teams at their spend cap (``capped_teams``) and fair
    share's judge (``share_judge``).
    Experiments with nothing queued (every message is a running trial) are left out."""
    rows: list[WaitingExperiment] = []
    for subject, count in work.items():
        parsed = parse_work_subject(topology, subject)
        if parsed is None or count <= 0:
            continue
        pool, cls, exp = parsed
        info = infos.get(exp)
        running = min(leases.get(exp, 0), count)
        if count - running <= 0:
            continue
        compute = _compute(info, pool)
        owner = owner_from_record(info.manifest.get("submitted_by")) if info else None
        limit = compute.n_concurrent_trials if info else None
        held = (paused_trials or {}).get(exp, 0)
        reason, detail = why_waiting(
            paused=paused.get(exp, False),
            refusal=pool_refusal(compute, runners),
            running=running,
            limit=limit,
            experiment_id=exp,
            queued=count - running,
            paused_trials=held,
            team_capped=(capped or {}).get(owner.team) if owner and owner.team else None,
            over_share=over_share(pool, classes.resolve(cls), exp) if over_share else None,
        )
        rows.append(
            WaitingExperiment(
                experiment_id=exp,
                name=info.name if info else exp,
                pool=pool,
                priority_class=classes.resolve(cls),
                team=owner.team if owner else None,
                user=owner.user if owner else None,
                queued=count - running,
                running=running,
                n_concurrent_trials=limit,
                paused_trials=held,
                reason=reason,
                detail=detail,
            )
        )
    rank = {name: i for i, name in enumerate(classes.names)}

    def order(pool: str, cls: str, team: str | None) -> tuple[str, int, str, bool, str]:
        return (pool, rank.get(cls, len(rank)), cls, team is None, team or "")

    rows.sort(key=lambda r: (*order(r.pool, r.priority_class, r.team), r.experiment_id))
    groups: dict[tuple[str, str, str | None], list[WaitingExperiment]] = {}
    for r in rows:
        groups.setdefault((r.pool, r.priority_class, r.team), []).append(r)
    return QueueView(
        groups=[
            QueueGroup(
                pool=pool,
                priority_class=cls,
                team=team,
                queued=sum(r.queued for r in members),
                running=sum(r.running for r in members),
                experiments=len(members),
                by_reason={
                    reason: n
                    for reason in REASONS
                    if (n := sum(r.queued for r in members if r.reason == reason))
                },
            )
            for (pool, cls, team), members in groups.items()
        ],
        experiments=rows,
    )
