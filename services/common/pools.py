"""Can any live runner run this manifest? Pure logic over the runner registry's records.

A manifest's trials go to the work subject of ``compute.pool``; a runner takes them
only if it serves that pool, and can run them only if it offers everything the
trials need: the capabilities in ``compute.requires`` and the environment itself
when it is one runners detect (``local``, ``docker``; services.runner.capabilities).
Cloud environments and ``module:Class`` ones are not detectable, so they add nothing.
A trial may also carry what its task requires (``TrialRequested.task_requires``, read
by the submitter from task.toml: ``local.allowlist``), judged by
:func:`task_requires_refusal`.

The submitter calls :func:`pool_refusal` with the live records
(``RunnerRegistry.live_runners()``) before publishing, and refuses with its message;
then :func:`agent_name_refusal`: agent names their Harbor does not ship; then
:func:`policy_refusal`: what those runners' policies would refuse anyway; then
:func:`secret_refusal`: API key variables no such runner has set; last
services.common.fit's ``combination_refusal``: needs that only several runners hold
between them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

from schemas.events import TrialRequested
from schemas.manifest import (
    LOCAL_ALLOWLIST,
    LOCAL_ENVIRONMENT_ALIAS,
    ComputeSpec,
    ExperimentManifest,
)
from schemas.runners import RunnerInfo
from services.common.runner_policy import (
    agent_refusals,
    compute_refusals,
    template_refusals,
    unknown_agent,
)
from services.common.task_variables import required_task_secrets, task_templates

DETECTED_ENVIRONMENTS = frozenset({LOCAL_ENVIRONMENT_ALIAS, "docker"})
"""Environments runners detect and announce as capabilities."""


def required_capabilities(compute: ComputeSpec) -> tuple[str, ...]:
    """What a runner must offer for ``compute``: its environment (when detectable) and
    ``requires``, in that order, without repeats."""
    env = [compute.environment] if compute.environment in DETECTED_ENVIRONMENTS else []
    return tuple(dict.fromkeys([*env, *compute.requires]))


def trial_capabilities(trial: TrialRequested) -> tuple[str, ...]:
    """What a runner must offer for ``trial``: its compute's (``required_capabilities``),
    then what its task requires (``task_requires``), without repeats."""
    return tuple(
        dict.fromkeys([*required_capabilities(trial.compute), *(trial.task_requires or ())])
    )


TASK_REQUIREMENTS = {
    LOCAL_ALLOWLIST: (
        "its task.toml asks for a network allowlist, which the local environment enforces "
        "only on a runner that runs as root"
    ),
}
"""Why a task requires each capability the submitter may read from it."""


def task_requires_refusal(
    trials: Iterable[TrialRequested], runners: Sequence[RunnerInfo]
) -> str | None:
    """None when, for every task with ``task_requires``, a live runner of its pool offers
    all its trials need; else which task requires what and why, e.g. ``task 'fetch'
    requires 'local.allowlist' (its task.toml asks for a network allowlist, ...), and no
    live runner in pool 'default' offers 'local' and 'local.allowlist'``."""
    problems: dict[str, None] = {}
    for trial in trials:
        if not trial.task_requires:
            continue
        needed = trial_capabilities(trial)
        pool = trial.compute.pool
        if any(r.pool == pool and set(needed) <= r.offers for r in runners):
            continue
        why = TASK_REQUIREMENTS.get
        wanted = ", ".join(f"{c!r} ({why(c, 'read from the task')})" for c in trial.task_requires)
        problems[
            f"task {trial.task.name!r} requires {wanted}, and no live runner in pool {pool!r} "
            f"offers {' and '.join(repr(c) for c in needed)}"
        ] = None
    return _refusal(problems, runners, "start such a runner in the pool, or leave the task out")


def pool_refusal(
    computes: ComputeSpec | Iterable[ComputeSpec], runners: Sequence[RunnerInfo]
) -> str | None:
    """None when, for every compute spec, a live runner of its pool offers all it needs;
    else why not, naming the pool, what is missing and what the live pools offer, e.g.
    ``no live runner in pool 'gpu' offers 'docker'; live pools: default (local) x2``.
    """
    specs = [computes] if isinstance(computes, ComputeSpec) else list(computes)
    problems: list[str] = []
    for pool, needed in dict.fromkeys((c.pool, required_capabilities(c)) for c in specs):
        members = [r for r in runners if r.pool == pool]
        if any(set(needed) <= r.offers for r in members):
            continue
        if not members:
            problems.append(f"no live runner in pool {pool!r}")
        elif len(needed) == 1:
            problems.append(f"no live runner in pool {pool!r} offers {needed[0]!r}")
        else:
            wanted = ", ".join(repr(n) for n in needed)
            problems.append(f"no live runner in pool {pool!r} offers all of {wanted}")
    return _refusal(
        problems,
        runners,
        "set compute.pool / compute.requires to what runs, or start a runner there",
    )


def _refusal(problems: Collection[str], runners: Sequence[RunnerInfo], fix: str) -> str | None:
    """None without ``problems``; else them, what the live pools offer, and ``fix``."""
    if not problems:
        return None
    return f"{'; '.join(problems)}; {live_pools_summary(runners)} ({fix})"


def live_pools_summary(runners: Sequence[RunnerInfo]) -> str:
    """``live pools: default (local) x2, gpu (docker, gpu) x1``, or ``no runner is live``."""
    if not runners:
        return "no runner is live"
    groups = Counter((r.pool, ", ".join(sorted(r.offers)) or "nothing") for r in runners)
    parts = [f"{pool} ({offers}) x{n}" for (pool, offers), n in sorted(groups.items())]
    return "live pools: " + ", ".join(parts)


def capable_runners(compute: ComputeSpec, runners: Sequence[RunnerInfo]) -> list[RunnerInfo]:
    """The runners of ``compute``'s pool that offer everything it needs, by runner id."""
    needed = set(required_capabilities(compute))
    return sorted(
        (r for r in runners if r.pool == compute.pool and needed <= r.offers),
        key=lambda r: r.runner_id,
    )


def _announced(
    compute: ComputeSpec,
    runners: Sequence[RunnerInfo],
    field: Callable[[RunnerInfo], Sequence[str] | None],
) -> tuple[list[RunnerInfo], set[str]] | None:
    """The runners of ``compute``'s pool that offer what it needs, and everything they
    announce in ``field``; None when there is none (pool_refusal says so) or one does
    not say (a runner older than the field): nothing is refused on a guess."""
    members = capable_runners(compute, runners)
    union: set[str] = set()
    for runner in members:
        said = field(runner)
        if said is None:
            return None
        union.update(said)
    return (members, union) if members else None


def agent_name_refusal(manifest: ExperimentManifest, runners: Sequence[RunnerInfo]) -> str | None:
    """None when the live runners of the manifest's pool that offer what it needs ship
    every agent it names (``RunnerInfo.harbor_agents``); else which names no such
    runner's Harbor knows, with the names closest to each. Runners that do not say
    (older ones) are not second-guessed, as for policies."""
    compute = manifest.compute
    if (announced := _announced(compute, runners, lambda r: r.harbor_agents)) is None:
        return None
    members, shipped = announced
    problems = [
        f"agents[{i}].name: {why}"
        for i, agent in enumerate(manifest.agents)
        if agent.name is not None and (why := unknown_agent(agent.name, shipped)) is not None
    ]
    if not problems:
        return None
    versions = ", ".join(sorted({r.harbor_version or "unknown" for r in members}))
    return "; ".join(problems) + (
        f" (Harbor {versions} on the live runners of pool {compute.pool!r})"
    )


def secret_refusal(
    manifest: ExperimentManifest,
    runners: Sequence[RunnerInfo],
    task_folders: Iterable[tuple[str, Path]] = (),
) -> str | None:
    """None when every variable an agent's ``api_key_env`` names, and every one a task
    needs (``task_variables.required_task_secrets``), is set on at least one live
    runner of the manifest's pool that offers what it needs (``RunnerInfo.secrets_set``);
    else which none has. Its trials would each fail at once (MissingSecretError).
    Runners that do not say (older ones) are not second-guessed."""
    if (announced := _announced(manifest.compute, runners, lambda r: r.secrets_set)) is None:
        return None
    _, held = announced
    needed = [
        (f"agents[{i}].api_key_env[{j}]", name)
        for i, agent in enumerate(manifest.agents)
        for j, name in enumerate(agent.api_key_env)
    ]
    needed += [
        (f"task {task}: {field}", name)
        for task, folder in task_folders
        for field, name in required_task_secrets(folder)
    ]
    pool = manifest.compute.pool
    problems = [
        f"{where}: {name} is set on no live runner of pool {pool!r}"
        for where, name in needed
        if name not in held
    ]
    if not problems:
        return None
    return "; ".join(problems) + (
        " (a runner reads its keys from its environment when it starts: set them there, "
        "e.g. in the shell of `trialbus up`, and restart the runners)"
    )


def policy_refusal(
    manifest: ExperimentManifest,
    runners: Sequence[RunnerInfo],
    task_folders: Iterable[tuple[str, Path]] = (),
) -> str | None:
    """None when a live runner of the manifest's pool that offers what it needs would
    accept every agent, the compute spec and the tasks' ``${NAME}`` templates under
    its published policy (services.common.runner_policy); else the refusals of such a
    runner, each naming the field and the rule. Runners that publish no policy (older
    ones) are not second-guessed: the runner enforces its policy again either way.
    """
    compute = manifest.compute
    members = capable_runners(compute, runners)
    templates: list[tuple[str, list[tuple[str, str]]]] | None = None
    first: tuple[RunnerInfo, list[str]] | None = None
    for runner in members:
        if runner.policy is None:
            return None
        if templates is None:  # each task folder read once, whatever the runners
            templates = [(name, task_templates(folder)) for name, folder in task_folders]
        refusals = [
            *(
                refusal
                for i, agent in enumerate(manifest.agents)
                for refusal in agent_refusals(runner.policy, agent, f"agents[{i}]")
            ),
            *compute_refusals(runner.policy, compute),
            *(
                refusal
                for name, found in templates
                for refusal in template_refusals(runner.policy, found, name)
            ),
        ]
        if not refusals:
            return None
        first = first or (runner, list(dict.fromkeys(refusals)))
    if first is None:
        return None  # no runner to ask: pool_refusal says so
    runner, refusals = first
    return (
        "; ".join(refusals) + f" (policy of runner {runner.runner_id!r} in pool {compute.pool!r}; "
        "change the manifest, or ask the runner operator to allow it in the runners' "
        "TRIALBUS_POLICY_FILE)"
    )
