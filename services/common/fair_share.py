"""Fair share between teams: the rule, and the keys it is kept in (pure, no I/O).

Each team has a **share** (the quotas file's ``teams.<team>.share``, else
``default.share``, else 1: equal shares). Inside one (pool, priority class), a trial of
team T may start unless another team U **waits** there (has queued trials) and runs
fewer trials per share than T does:

    T is held back  <=>  some waiting U != T with  running(U) / share(U) < running(T) / share(T)

So the next slot always goes to a waiting team furthest below its share, and while
several teams wait the running trials settle at ``slots x share / sum of the waiting
teams' shares`` each (3:1 on 4 slots: 3 and 1). A team alone, or whose rivals wait
for nothing, is never held back (it may use the whole pool); ties start (1:1 on 4
slots: 2 and 2). Classes come first: the runners share their slots between classes by
weight (services/runner/selection.py), and this rule then splits a class's starts
between its teams; a team's trials of one class never count against another class.

Where the counts come from (services/runner/fair_share.py): running(T) is the number
of share marks ``_share.<pool>.<class>.<team key>.<run key>`` in the leases bucket (a
running trial of a team holds one, renewed and released like its experiment's lease);
who waits comes from the work stream's messages per subject and the key
``share.<experiment>`` the submitter writes (the experiment's team, and its share as
it was at submit). The share judged is the one the submitter **last published** with
the team limits (``quota.limits``, ``current_share``), so a changed share reaches
queued work; the experiment's own is the fallback when none is published.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.quotas import Quotas, team_key

DEFAULT_SHARE = 1.0
"""A team's share when the quotas file gives none: equal shares."""
SHARE_MARK = "_share"
"""First token of a running trial's share mark in the leases bucket (no experiment id
starts with ``_``, so marks never mix with experiment leases)."""


@dataclass(frozen=True, slots=True)
class TeamShare:
    """The team an experiment counts for, and that team's share (stored per experiment
    by the submitter under ``share.<experiment>``)."""

    team: str
    share: float

    def encode(self) -> bytes:
        """Compact JSON (the stored value)."""
        return json.dumps({"team": self.team, "share": self.share}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> TeamShare | None:
        """A stored value; anything unreadable is no team (fair share is a scheduling
        aid: a bad key must not stop a trial)."""
        if not data:
            return None
        try:
            raw = json.loads(data)
            team, share = raw["team"], float(raw["share"])
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(team, str) or not team or not math.isfinite(share) or share <= 0:
            return None
        return cls(team, share)


def current_share(team: TeamShare, limits: Quotas | None) -> TeamShare:
    """``team`` with the share the published limits (``quota.limits``) give it now, by
    the rule of submit (``Quotas.share_of``: its entry's, a team not listed the
    default's, none given: 1). With none published (or unreadable: None), the share
    stored at submit. Unchanged: the same object (no copy per delivery)."""
    if limits is None:
        return team
    share = limits.share_of(team.team)
    return team if share == team.share else TeamShare(team.team, share)


def share_key(experiment_id: str) -> str:
    """The control bucket's key of an experiment's team and share."""
    return f"share.{experiment_id}"


def mark_prefix(pool: str, priority_class: str) -> str:
    """Leading tokens of the share marks of (``pool``, ``priority_class``)."""
    return f"{SHARE_MARK}.{pool}.{priority_class}"


def mark_key(pool: str, priority_class: str, team: str, run_key: str) -> str:
    """The share mark a running trial of ``team`` holds (``run_key``: its run id as a KV
    token)."""
    return f"{mark_prefix(pool, priority_class)}.{team_key(team)}.{run_key}"


def marks_by_class(keys: Mapping[str, int], pool: str) -> dict[tuple[str, str], int]:
    """Running trials per (class, team key) from the share marks of ``pool`` (keys
    relative to the bucket: ``_share.<pool>.<class>.<team key>.<run key>``)."""
    head = f"{SHARE_MARK}.{pool}."
    out: dict[tuple[str, str], int] = {}
    for key, n in keys.items():
        if n <= 0 or not key.startswith(head):
            continue
        parts = key[len(head) :].split(".", 2)
        if len(parts) == 3:
            slot = (parts[0], parts[1])
            out[slot] = out.get(slot, 0) + 1
    return out


def waiting(messages: Mapping[str, int], running: Mapping[str, int]) -> set[str]:
    """Teams with queued trials: more work messages (queued plus running: a work-queue
    stream keeps a message until it is acknowledged) than running trials."""
    return {t for t, n in messages.items() if n > running.get(t, 0)}


def held_back(
    team: str,
    share: float,
    running: Mapping[str, int],
    waiting_shares: Mapping[str, float],
) -> str | None:
    """Why a trial of ``team`` (of ``share``) must not start now (the module's rule),
    or None when it may. ``running``: trials running per team in its (pool, class);
    ``waiting_shares``: the share of each team with queued trials there. Team names
    here may be names or team keys, as long as both mappings use the same."""
    mine = running.get(team, 0) / share
    for other in sorted(waiting_shares):
        theirs = running.get(other, 0) / waiting_shares[other]
        if other != team and theirs < mine:
            return (
                f"over its fair share: team {team!r} runs {running.get(team, 0)} at share "
                f"{share:g} while team {other!r} waits, running {running.get(other, 0)} at "
                f"share {waiting_shares[other]:g}; the next slot goes to the team furthest "
                "below its share"
            )
    return None


def entitled(shares: Mapping[str, float], slots: int) -> dict[str, float]:
    """Slots each team settles at when all of ``shares`` wait for ``slots`` slots:
    ``slots x share / sum of shares`` (what the tests and the queue's words compare
    against; the rule above reaches it to within one slot per team)."""
    total = sum(shares.values())
    if total <= 0:
        return {t: 0.0 for t in shares}
    return {t: slots * s / total for t, s in shares.items()}
