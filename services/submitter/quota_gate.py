"""Team quotas at submit: refuse what would pass a team's daily quotas, count the rest.

Called by ``submit.publish_experiment`` once it knows how many trials a submission
will publish (trials already scored are not run again, so they do not count), before
anything is published. The trials-per-day tally is counted where it is checked, in one
compare-and-set on the control bucket (``Coordinator.add_tally``): two submitters
racing for a team's last trials cannot both pass. Why this source and not the ledger:
the ledger learns of a submission only once the importer recorded it (seconds later,
so quick submissions would all pass) and has no query by team and time; the tally is
one read and one write, whatever the fleet's history.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import TeamRef
from services.common.ports import Coordinator
from services.common.quotas import (
    QuotaExceeded,
    TeamQuota,
    spend_refusal,
    team_ref,
    trials_refusal,
)


@dataclass(frozen=True, slots=True)
class QuotaGate:
    """One submission's team, its quota, and the coordinator that keeps the tallies."""

    coordinator: Coordinator
    team: str
    quota: TeamQuota

    async def check_spend(self) -> None:
        """Refuse (QuotaExceeded) when the team's spend over the last 24 h reached its
        cap: its runners would pause the experiment at its first trial anyway."""
        if self.quota.max_spend_usd_per_day is None:
            return
        spent = await self.coordinator.tally("spend", self.team, fresh=True)
        refusal = spend_refusal(self.team, self.quota, spent)
        if refusal is not None:
            raise QuotaExceeded(refusal)

    async def admit(self, n_trials: int) -> TeamRef | None:
        """Count ``n_trials`` against the team's day, or refuse (QuotaExceeded naming
        the quota, its limit and the use); returns what the work messages carry."""
        quota, team = self.quota, self.team
        if quota.max_trials_per_day is not None and n_trials:
            added, used = await self.coordinator.add_tally(
                "trials", team, n_trials, limit=quota.max_trials_per_day
            )
            if not added:
                raise QuotaExceeded(
                    trials_refusal(team, quota, n_trials, used) or "quota max_trials_per_day"
                )
        return team_ref(team, quota)

    async def give_back(self, n_trials: int) -> None:
        """Uncount trials that were not published after all (JetStream's dedup dropped
        them: they were queued already and counted then)."""
        if self.quota.max_trials_per_day is not None and n_trials > 0:
            await self.coordinator.add_tally("trials", self.team, -n_trials)
