"""What a trial needs of the runner that takes it, and whether a runner has it.

A trial needs its environment, ``compute.requires`` and what its task requires
(capabilities: ``pools.trial_capabilities``), and every
variable its agent's ``api_key_env`` and its task's task.toml name
(``TrialRequested.needed_variables``), each allowed by the runner's policy and set in
its environment. :class:`Fit` is what one runner holds, :meth:`Fit.lack` what it lacks
for a trial; :func:`can_run` asks it of a runner's registry record. The runner asks
before it takes a trial (services/runner/fit.py: it hands the trial to a peer that
can run it); the submitter before it publishes (:func:`combination_refusal`, from
services/submitter/handlers.py ``check_runners``), so both judge a pool the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.events import TrialRequested
from schemas.runners import RunnerInfo, forbidden_secret_name
from services.common.pools import TASK_REQUIREMENTS, trial_capabilities


@dataclass(frozen=True, slots=True)
class Lack:
    """What a runner lacks to run one trial."""

    capabilities: tuple[str, ...] = ()
    """Environments, labels and task requirements the trial needs that the runner does not
    offer."""
    variables: tuple[str, ...] = ()
    """The variables it needs (the agent's ``api_key_env``, the task's) that the runner's
    policy allows and it has not set."""
    refused: tuple[str, ...] = ()
    """The variables it needs that the runner's policy does not allow."""

    def __bool__(self) -> bool:
        return bool(self.capabilities or self.variables or self.refused)

    def describe(self, request: TrialRequested) -> str:
        """``does not offer 'docker'; has no ANTHROPIC_API_KEY set (api_key_env of agent
        'claude-code')``; a task's variable is named as ``task.toml of task 't'``."""
        parts = []
        if self.capabilities:
            parts.append(
                f"does not offer {', '.join(repr(c) for c in self.capabilities)}"
                + "".join(
                    f" (task {request.task.name!r}: {TASK_REQUIREMENTS[c]})"
                    for c in self.capabilities
                    if c in (request.task_requires or ()) and c in TASK_REQUIREMENTS
                )
            )
        if self.variables:
            parts.append(f"has no {', '.join(self.variables)} set ({_of(request, self.variables)})")
        if self.refused:
            parts.append(
                f"may not pass {', '.join(self.refused)} to a trial "
                f"({_of(request, self.refused)}; not in its policy's secret_names: add it to "
                "extra_secret_names on the runners to allow it)"
            )
        return "; ".join(parts)


def _of(request: TrialRequested, names: tuple[str, ...]) -> str:
    """Where ``names`` come from: the agent's api_key_env, the task's task.toml, or both."""
    agent = set(request.agent.api_key_env)
    sources = []
    if any(n in agent for n in names):
        sources.append(f"api_key_env of agent {request.agent.display!r}")
    if any(n not in agent for n in names):
        sources.append(f"task.toml of task {request.task.name!r}")
    return " and ".join(sources)


@dataclass(frozen=True, slots=True)
class Fit:
    """What this runner has: ``offers`` (capabilities; None: any trial's), ``secrets``
    (the variable names it has set; None: left to the trial process) and ``allowed``
    (the names its policy lets it pass to a trial; None: any)."""

    offers: frozenset[str] | None = None
    secrets: frozenset[str] | None = None
    allowed: frozenset[str] | None = None

    def lack(self, request: TrialRequested) -> Lack:
        """What this runner lacks to run ``request`` (falsy: nothing)."""
        caps = (
            ()
            if self.offers is None
            else tuple(c for c in trial_capabilities(request) if c not in self.offers)
        )
        names = request.needed_variables()
        refused = tuple(n for n in names if not self._allows(n))
        keys = (
            ()
            if self.secrets is None
            else tuple(n for n in names if self._allows(n) and n not in self.secrets)
        )
        return Lack(caps, keys, refused)

    def _allows(self, name: str) -> bool:
        return not forbidden_secret_name(name) and (self.allowed is None or name in self.allowed)


def can_run(runner: RunnerInfo, request: TrialRequested) -> bool:
    """Whether ``runner`` (as it announces itself) has what ``request`` needs: its pool,
    every capability, every variable (the agent's ``api_key_env``, the task's), allowed
    by its policy and set. A runner that does not say which variables it has (older) is
    not counted on for a trial that needs one."""
    if runner.pool != request.compute.pool:
        return False
    held = _fit_of(runner)
    if held.secrets is None and request.needed_variables():
        return False
    return not held.lack(request)


RUNNERS_NAMED = 3
"""How many runners a combination refusal says the lack of."""


def combination_refusal(
    trials: Sequence[TrialRequested], runners: Sequence[RunnerInfo]
) -> str | None:
    """None when each trial's needs are held by ONE live runner of its pool
    (:func:`can_run`, as a runner judges a peer); else which agent and task need
    together what no single runner holds, and what each of the pool's runners lacks.

    The submitter's other checks name each thing no runner of the pool holds at all;
    this one finds needs split across runners (one holds the agent's key, another the
    task's), whose trials every runner would end at once. Trials are judged once per
    distinct need; runners that do not say which variables they have (older) are not
    second-guessed.
    """
    problems: list[str] = []
    judged: set[tuple[str, tuple[str, ...], tuple[str, ...]]] = set()
    for trial in trials:
        compute = trial.compute
        need = (compute.pool, trial_capabilities(trial), tuple(trial.needed_variables()))
        if need in judged:
            continue
        judged.add(need)
        members = sorted((r for r in runners if r.pool == compute.pool), key=lambda r: r.runner_id)
        if any(r.secrets_set is None for r in members) and trial.needed_variables():
            continue  # an older runner may hold them: not refused on a guess
        if not members or any(can_run(r, trial) for r in members):
            continue  # no runner at all: pool_refusal says so
        lacks = "; ".join(
            f"{r.runner_id} {_fit_of(r).lack(trial).describe(trial)}"
            for r in members[:RUNNERS_NAMED]
        )
        more = f" (and {len(members) - RUNNERS_NAMED} more)" if len(members) > RUNNERS_NAMED else ""
        problems.append(
            f"agent {trial.agent.display!r} on task {trial.task.name!r} needs "
            f"{', '.join([*need[1], *need[2]])} on one runner, and no live runner of pool "
            f"{compute.pool!r} has them all: {lacks}{more}"
        )
    if not problems:
        return None
    return "; ".join(problems) + (
        " (its trials would each end at once: give one runner of the pool everything they "
        "need, or split the experiment)"
    )


def _fit_of(runner: RunnerInfo) -> Fit:
    """What ``runner`` holds, as its registry record says."""
    return Fit(
        runner.offers,
        None if runner.secrets_set is None else frozenset(runner.secrets_set),
        None if runner.policy is None else runner.policy.allowed_secrets,
    )
