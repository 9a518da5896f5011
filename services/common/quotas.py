"""Team quotas: the operator's file, and the pure arithmetic of the daily tallies.

The operator names a YAML (or JSON) file in ``TRIALBUS_QUOTAS_FILE``::

    teams:
      red:  {max_concurrent_trials: 8, max_trials_per_day: 2000, max_spend_usd_per_day: 50,
             share: 3}
      blue: {max_trials_per_day: 500}   # share 1 (the default: equal shares)
    default: {max_concurrent_trials: 4}   # any team the file does not list

Every field is optional; a team without an entry (and no ``default``) has no quota. A
team is the ``team`` of the API token that submitted (``api_tokens.Identity``); CLI
submissions have none unless ``TRIALBUS_CLI_TEAM`` names one (docs/scheduling.md).

The daily quotas count over a **rolling window of 24 hourly buckets** (the current
UTC hour and the 23 before it), kept as one small JSON object per team and tally in
the control bucket, updated with a compare-and-set (services.common.adapters.nats_kv).
The functions here decide; they never do I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from schemas.documented import DOCUMENTED
from schemas.events import TeamRef
from services.common.errors import UserInputError
from services.common.small_files import read_small_file
from services.common.validation import problem_lines

WINDOW_HOURS = 24
MAX_QUOTAS_FILE_BYTES = 1024 * 1024
TEAM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$"
"""A team name as the API tokens file allows it (api_tokens.NAME_PATTERN)."""
_KEY_SAFE = re.compile(r"[A-Za-z0-9_-]")


class QuotaConfigError(UserInputError):
    """The quotas file cannot be read or is invalid (start-up error, exit 2)."""


class QuotaExceeded(UserInputError):
    """A submission would pass its team's quota (HTTP 429, CLI exit 2)."""


class TeamQuota(BaseModel):
    """One team's limits; an absent field is no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    max_concurrent_trials: int | None = Field(default=None, ge=1, le=1_000_000)
    """At most this many of the team's trials run at once across every runner."""
    max_trials_per_day: int | None = Field(default=None, ge=0, le=1_000_000_000)
    """At most this many trials submitted by the team in the last 24 hours."""
    max_spend_usd_per_day: float | None = Field(default=None, ge=0)
    """The team's trials stop starting once its spend in the last 24 hours reaches this (USD)."""
    share: float | None = Field(default=None, gt=0, le=1_000_000)
    """The team's fair share of a pool while other teams wait (None: 1, equal shares;
    services/common/fair_share.py)."""

    @field_validator("max_spend_usd_per_day", "share")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class _QuotasFile(BaseModel):
    """The team quotas file (``TRIALBUS_QUOTAS_FILE``, YAML or JSON)."""

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    teams: dict[str, TeamQuota] = Field(default_factory=dict)
    """Each named team's limits."""
    default: TeamQuota | None = None
    """The limits of a team the file does not name (None: no limits)."""

    @field_validator("teams")
    @classmethod
    def _names(cls, v: dict[str, TeamQuota]) -> dict[str, TeamQuota]:
        for name in v:
            if not re.match(TEAM_PATTERN, name):
                raise ValueError(f"team name {name!r} must match {TEAM_PATTERN}")
        return v


@dataclass(frozen=True, slots=True)
class Quotas:
    """The installation's quotas: per team, and a default for teams not listed."""

    teams: dict[str, TeamQuota]
    default: TeamQuota | None = None

    def for_team(self, team: str | None) -> TeamQuota | None:
        """The quota that applies to ``team`` (None: no team, or no entry and no default)."""
        if team is None:
            return None
        return self.teams.get(team, self.default)

    def share_of(self, team: str) -> float:
        """The team's fair share: its entry's ``share``, else 1 (equal shares)."""
        quota = self.for_team(team)
        return quota.share if quota is not None and quota.share is not None else 1.0


def _message(err: ErrorDetails) -> str | None:
    if err["type"] == "extra_forbidden":
        return (
            "unknown field (a team's fields: max_concurrent_trials, max_trials_per_day, "
            "max_spend_usd_per_day, share; top level: teams, default)"
        )
    return None


def parse_quotas(source: str, raw: bytes) -> Quotas:
    """Quotas from the file's bytes; QuotaConfigError naming ``source`` and the field."""
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        raise QuotaConfigError(
            f"{source}: not valid YAML or JSON (expected `teams: {{red: "
            "{max_trials_per_day: 100}}`)"
        ) from None
    try:
        parsed = _QuotasFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise QuotaConfigError(problem_lines(source, exc, _message)) from None
    return Quotas(teams=dict(parsed.teams), default=parsed.default)


def load_quotas(path: Path) -> Quotas:
    """Read ``TRIALBUS_QUOTAS_FILE`` (raises QuotaConfigError naming the file)."""
    try:
        raw = read_small_file(path, MAX_QUOTAS_FILE_BYTES)
    except (OSError, ValueError) as exc:
        raise QuotaConfigError(f"cannot read the quotas file {path}: {exc}") from None
    return parse_quotas(str(path), raw)


def team_ref(team: str, quota: TeamQuota) -> TeamRef | None:
    """What a work message carries for runners: the limits they enforce, or None when
    runners have nothing to enforce (an unquota'd trial pays nothing on the start path)."""
    if quota.max_concurrent_trials is None and quota.max_spend_usd_per_day is None:
        return None
    return TeamRef(
        name=team,
        max_concurrent_trials=quota.max_concurrent_trials,
        max_spend_usd_per_day=quota.max_spend_usd_per_day,
    )


def team_key(team: str) -> str:
    """``team`` as one KV key token: every character outside ``[A-Za-z0-9_-]``
    (``.`` ``@`` ``+``) becomes ``=XX`` (its hex code); injective, as names hold no ``=``."""
    return "".join(c if _KEY_SAFE.match(c) else f"={ord(c):02X}" for c in team)


# -- rolling 24-hour tallies -----------------------------------------------------------
Tally = dict[str, float]
"""Hour (``YYYY-MM-DDTHH``, UTC) -> amount counted in that hour."""


def hour_of(now: datetime) -> str:
    """The bucket of ``now`` (timezone-aware)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H")


def _live_hours(now: datetime) -> set[str]:
    return {hour_of(now - timedelta(hours=h)) for h in range(WINDOW_HOURS)}


def decode_tally(data: bytes | None) -> Tally:
    """A stored tally; anything unreadable counts as empty (a tally is an accounting aid,
    never a reason to stop the fleet)."""
    if not data:
        return {}
    try:
        raw = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and math.isfinite(v) and v > 0
    }


def encode_tally(tally: Tally) -> bytes:
    """Compact, sorted JSON (the same tally gives the same bytes)."""
    return json.dumps(dict(sorted(tally.items())), separators=(",", ":")).encode()


def window_total(tally: Tally, now: datetime) -> float:
    """What was counted in the window ending at ``now``."""
    live = _live_hours(now)
    return sum(v for k, v in tally.items() if k in live)


def window_add(tally: Tally, now: datetime, amount: float) -> Tally:
    """``tally`` with ``amount`` added to the current hour, hours out of the window
    dropped (so the stored object holds at most 24 entries); a negative ``amount``
    gives back, never below zero."""
    live = _live_hours(now)
    out = {k: v for k, v in tally.items() if k in live}
    hour = hour_of(now)
    out[hour] = max(0.0, out.get(hour, 0.0) + amount)
    if out[hour] == 0.0:
        del out[hour]
    return out


# -- the refusals ----------------------------------------------------------------------
def trials_refusal(team: str, quota: TeamQuota, requested: int, used: float) -> str | None:
    """Why ``requested`` more trials pass the team's trials-per-day quota, or None."""
    limit = quota.max_trials_per_day
    if limit is None or requested == 0 or used + requested <= limit:
        return None
    left = max(0, limit - int(used))
    return (
        f"quota max_trials_per_day of team {team!r}: {int(used)} of {limit} trials used in "
        f"the last 24 h, this submission has {requested} to run ({left} left); wait, "
        "submit fewer trials, or ask an operator to raise it (TRIALBUS_QUOTAS_FILE)"
    )


def spend_refusal(team: str, quota: TeamQuota, spent: float) -> str | None:
    """Why the team may start nothing more today (its spend reached the cap), or None."""
    cap = quota.max_spend_usd_per_day
    if cap is None or spent < cap:
        return None
    return (
        f"quota max_spend_usd_per_day of team {team!r}: ${spent:.4f} of ${cap:g} spent in "
        "the last 24 h; wait for the window to move on, or ask an operator to raise it "
        "(TRIALBUS_QUOTAS_FILE)"
    )


# -- the limits runners read per delivery ----------------------------------------------
LIMITS_KEY = "quota.limits"
"""The control-bucket key where the submitter publishes the runner-enforced limits of
its quotas file whenever it loads it (docs/scheduling.md, "Limits read per delivery")."""


def encode_limits(quotas: Quotas) -> bytes:
    """What runners enforce of ``quotas`` (concurrency, spend and fair share per team,
    and the default), and the daily trials quota a ``trialbus submit`` without the file
    is held to (services.submitter.commands.held_to), as compact sorted JSON: one key
    for every team, so a team removed from the file loses its limits too (the submitter
    may not list keys to remove)."""

    def enforced(quota: TeamQuota | None) -> dict[str, float | int] | None:
        if quota is None:
            return None
        # The share rides along so a changed share reaches queued work as a changed
        # limit does (services/common/fair_share.py current_share).
        return quota.model_dump(
            include={
                "max_concurrent_trials",
                "max_spend_usd_per_day",
                "share",
                "max_trials_per_day",
            },
            exclude_none=True,
        )

    body = {
        "teams": {name: enforced(q) for name, q in sorted(quotas.teams.items())},
        "default": enforced(quotas.default),
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_limits(data: bytes | None) -> Quotas | None:
    """The published limits, or None when none are published or they cannot be read
    (then runners keep the limits the message carries)."""
    if not data:
        return None
    try:
        parsed = _QuotasFile.model_validate_json(data)
    except ValidationError:
        return None
    return Quotas(teams=dict(parsed.teams), default=parsed.default)


def current_team(team: TeamRef, limits: Quotas) -> TeamRef:
    """``team`` with the limits ``limits`` give it now (both None: it has none now)."""
    quota = limits.for_team(team.name) or TeamQuota()
    if (quota.max_concurrent_trials, quota.max_spend_usd_per_day) == (
        team.max_concurrent_trials,
        team.max_spend_usd_per_day,
    ):
        return team
    return TeamRef(
        name=team.name,
        max_concurrent_trials=quota.max_concurrent_trials,
        max_spend_usd_per_day=quota.max_spend_usd_per_day,
    )
