"""What a trial needs of the runner that takes it, and whether another runner has it.

A pool is meant to be a set of like runners, and often is not: one machine holds an
API key another lacks, or has docker, or bubblewrap. The submitter accepts a manifest
when one live runner of its pool has what it needs (services/common/pools.py), but
every runner of the pool takes work from the same durable. So a runner that lacks
what a trial needs (an environment or label it does not offer, an agent's
``api_key_env`` variable it does not have) hands the trial back for another live
runner of its pool that has it (the runner registry says who: ``Peers``), with no
attempt counted; it ends the trial (final ``RunnerLacksCapability``) only when no
other live runner has it, since then waiting would hold the trial forever.

A task's own ``${NAME}`` variables count the same way when the work message names them
(``TrialRequested.task_variables``: the submitter read them from task.toml). A task
given by checksum names none; its variables are known only once its archive is
unpacked, and the trial process checks them (MissingSecretError, final), as it checks
the agent's keys and the task's again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from schemas.events import TrialRequested
from schemas.runners import RunnerInfo, forbidden_secret_name
from services.common.logging import get_logger
from services.common.pools import required_capabilities
from services.common.ports import RunnerRegistry

log = get_logger(__name__)

PEERS_TTL_S = 2.0
"""The live runners are read again after this long (one KV listing per runner then,
however many trials it hands back meanwhile)."""


@dataclass(frozen=True, slots=True)
class Lack:
    """What a runner lacks to run one trial."""

    capabilities: tuple[str, ...] = ()
    """Environments and labels the trial requires that the runner does not offer."""
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
            parts.append(f"does not offer {', '.join(repr(c) for c in self.capabilities)}")
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
            else tuple(c for c in required_capabilities(request.compute) if c not in self.offers)
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
    held = Fit(
        runner.offers,
        None if runner.secrets_set is None else frozenset(runner.secrets_set),
        None if runner.policy is None else runner.policy.allowed_secrets,
    )
    if held.secrets is None and request.needed_variables():
        return False
    return not held.lack(request)


@dataclass(slots=True)
class Peers:
    """The other live runners, read through the registry at most every ``ttl_s``."""

    registry: RunnerRegistry
    runner_id: str
    ttl_s: float = PEERS_TTL_S
    clock: Callable[[], float] = time.monotonic
    _runners: list[RunnerInfo] | None = None
    _read_at: float = 0.0

    async def another_can_run(self, request: TrialRequested) -> bool:
        """Whether a live runner other than this one has what ``request`` needs. A
        registry that cannot be read counts as yes: the trial waits in the queue (and
        this is asked again) rather than failing for a moment's outage."""
        try:
            runners = await self._live()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("runner registry unreadable", error=f"{type(exc).__name__}: {exc}")
            return True
        return any(r.runner_id != self.runner_id and can_run(r, request) for r in runners)

    async def _live(self) -> list[RunnerInfo]:
        now = self.clock()
        if self._runners is None or now - self._read_at >= self.ttl_s:
            self._runners = await self.registry.live_runners()
            self._read_at = now
        return self._runners
