"""What may stop a trial before it starts: its agent was stopped, or its budget is spent.

Two rules, both kept in the Coordinator so every runner applies them:

- **Agent stops.** When an attempt fails with a provider error that will fail every
  trial of that agent configuration in the experiment (the key is refused, the account
  has no credit: ``failures.stops_agent``), the runner stores a stop for (experiment,
  agent key) before it publishes the ending. Later trials of that agent in the
  experiment end at once as a final TrialFailed ``AgentStopped`` (infrastructure,
  unscored) whose message names the first failure, its trial and the fix. The next
  submission of the experiment lifts the stop (services/submitter/handlers.submit).
- **Budgets.** The submitter stores the manifest's ``budget``; after each attempt that
  left a result.json the runner adds its tokens and cost to the experiment's running
  spend; once the spend reaches the budget, trials not yet started end as a final
  TrialFailed ``BudgetExceeded`` (unscored). An attempt without a price adds its tokens
  and counts as unpriced: a USD budget cannot see what it cost, and the message says so.

- **Team spend cap** (``TrialRequested.team.max_spend_usd_per_day``, set by the
  submitter from the operator's quotas): after each priced attempt the runner adds its
  cost to the team's rolling 24-h tally too; once the tally reaches the cap, the
  team's queued trials are **held back** unstarted (handed back like a paused trial,
  no attempt counted; the runner's log names the cap). The runner does not set the
  pause flag: its bus user may not touch pause flags. Raising the cap (in the quotas
  file, published again) or the window moving on continues them.
- **Current limits** (``current_limits``): a teamed trial is judged by the limits the
  submitter last published (``quota.limits``), not those stamped at submit, so an
  operator's change reaches queued work; the message's copy is the fallback.

Trials already running when a stop, the budget or the cap is reached run to their
end: a budget or cap is therefore overshot by at most the trials in flight.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.events import TrialRequested
from schemas.harbor_result import HarborAgentResult, HarborTrialResult
from schemas.ids import agent_key
from schemas.manifest import BudgetSpec
from services.common.failures import stops_agent
from services.common.folder_reads import read_inside
from services.common.ports import Coordinator, ExecutionOutcome, Spend
from services.common.quotas import current_team
from services.runner import policy

# result.json of a trial is Harbor's own small file; a bigger one is not read.
MAX_RESULT_BYTES = 8 * 1024 * 1024

FIX = {
    "authentication": "set {env} on the runners (a valid key) and resubmit",
    "quota": "add credit or raise the quota of the provider account behind {env} and resubmit",
}


def agent_key_of(request: TrialRequested) -> str:
    """The agent configuration's key (the one its trial ids hash)."""
    agent = request.agent
    return agent_key(agent.agent_ref, agent.model, agent.kwargs)


async def refusal(coord: Coordinator, request: TrialRequested, host: str) -> policy.Decision | None:
    """The final failure of a trial that must not start, or None when it may."""
    exp = request.experiment_id
    stop = await coord.agent_stop(exp, agent_key_of(request))
    if stop is not None:
        return policy.refused(request, host, policy.AGENT_STOPPED, stopped_message(request, stop))
    raw = await coord.budget(exp)
    if raw is None:
        return None
    budget = BudgetSpec.model_validate_json(raw)
    spent = await coord.spent(exp)
    over = exceeded(budget, spent)
    if over is None:
        return None
    return policy.refused(request, host, policy.BUDGET_EXCEEDED, over)


async def current_limits(coord: Coordinator, request: TrialRequested, log: Any) -> TrialRequested:
    """``request`` with its team's limits as the submitter last published them
    (``quota.limits``, one cached read a second per runner), so a lowered quota reaches
    work already queued; the message's copy when none are published or the read fails
    (a scheduling aid never stops the fleet). A trial without a team reads nothing."""
    team = request.team
    if team is None:
        return request
    try:
        limits = await coord.team_limits()
    except Exception as exc:  # noqa: BLE001 - fail open to the message's copy, said once
        log.warning("team limits unreadable; using the message's", error=f"{type(exc).__name__}")
        return request
    if limits is None:
        return request
    now = current_team(team, limits)
    return request if now is team else request.model_copy(update={"team": now})


async def team_capped(coord: Coordinator, request: TrialRequested) -> str | None:
    """Why the trial's team may start nothing more (its spend cap is reached), or
    None; a trial without a team spend cap reads nothing."""
    team = request.team
    if team is None or team.max_spend_usd_per_day is None:
        return None
    spent = await coord.tally("spend", team.name)
    if spent < team.max_spend_usd_per_day:
        return None
    return (
        f"team {team.name!r} reached its quota max_spend_usd_per_day: ${spent:.4f} of "
        f"${team.max_spend_usd_per_day:g} in the last 24 h; experiment "
        f"{request.experiment_id} held back until the cap is raised or the window has "
        "moved on"
    )


def stopped_message(request: TrialRequested, stop: bytes) -> str:
    """One clear sentence: which agent, the first failure and its trial, the fix."""
    why = json.loads(stop)
    env = " / ".join(request.agent.api_key_env) or "the agent's API key (named in api_key_env)"
    fix = FIX.get(why.get("kind"), FIX["authentication"]).format(env=env)
    return (
        f"agent {request.agent.display!r} stopped in experiment {request.experiment_id}: "
        f"trial {why.get('trial_id')} failed with {why.get('error_type')} "
        f"({why.get('kind')}), which every trial of this agent would repeat; {fix}"
    )


def exceeded(budget: BudgetSpec, spent: Spend) -> str | None:
    """Why the budget is spent (a message), or None while it is not."""
    unpriced = (
        f"; {spent.unpriced} attempts had no price: their tokens count, their cost is unknown"
        if spent.unpriced
        else ""
    )
    if budget.max_cost_usd is not None and spent.cost_usd >= budget.max_cost_usd:
        return (
            f"budget spent: ${spent.cost_usd:.4f} of max_cost_usd ${budget.max_cost_usd:g}"
            f"{unpriced}; raise budget.max_cost_usd in the manifest and resubmit"
        )
    if budget.max_tokens is not None and spent.tokens >= budget.max_tokens:
        return (
            f"budget spent: {spent.tokens} of max_tokens {budget.max_tokens} tokens"
            f"{unpriced}; raise budget.max_tokens in the manifest and resubmit"
        )
    return None


async def account(
    coord: Coordinator, request: TrialRequested, outcome: ExecutionOutcome, log: Any
) -> None:
    """After an attempt: add its usage to the spend; stop the agent on an error that
    every trial of it would repeat. Never raises: a lost total or stop costs trials,
    never the result in hand."""
    try:
        if outcome.trial_dir is not None:
            usage = attempt_spend(outcome.trial_dir)
            if usage is not None:
                await coord.add_spend(request.experiment_id, usage)
                team = request.team
                if team is not None and team.max_spend_usd_per_day is not None:
                    await coord.add_tally("spend", team.name, usage.cost_usd)
        kind = stops_agent(outcome.exception_type, outcome.message)
        if kind is not None:
            reason = json.dumps(
                {"kind": kind, "error_type": outcome.exception_type, "trial_id": request.trial_id}
            ).encode()
            await coord.stop_agent(request.experiment_id, agent_key_of(request), reason)
            log.error(
                "provider refused the agent: its remaining trials in the experiment stop",
                kind=kind,
                error_type=outcome.exception_type,
            )
    except Exception as exc:  # noqa: BLE001 - best effort, see the docstring
        log.warning("could not account for the attempt", error=f"{type(exc).__name__}: {exc}")


def attempt_spend(trial_dir: Path) -> Spend | None:
    """Tokens and cost the attempt's result.json reports (steps summed), or None."""
    data = read_inside(trial_dir, "result.json", MAX_RESULT_BYTES)
    if not isinstance(data, bytes):
        return None
    try:
        result = HarborTrialResult.model_validate_json(data)
    except ValidationError:
        return None
    contexts = [result.agent_result] if result.agent_result is not None else []
    steps = [] if contexts else (result.step_results or [])
    for step in steps:
        try:
            contexts.append(HarborAgentResult.model_validate(step.get("agent_result") or {}))
        except ValidationError:
            continue
    tokens, cost, priced = 0, 0.0, False
    for ctx in contexts:
        for n in (ctx.n_input_tokens, ctx.n_output_tokens):
            tokens += n if n is not None and n > 0 else 0
        if ctx.cost_usd is not None and math.isfinite(ctx.cost_usd) and ctx.cost_usd >= 0:
            cost, priced = cost + ctx.cost_usd, True
    if not tokens and not priced:
        return None
    return Spend(cost_usd=cost, tokens=tokens, attempts=1, unpriced=0 if priced else 1)
