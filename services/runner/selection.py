"""Which priority class a free slot fetches from: weighted deficit round robin (pure).

Each class has a weight (services.common.priority). At every pick, each class that has
work waiting earns its weight in credit; the class with the most credit is picked and
pays the sum of the weights of the classes that were waiting (nginx's smooth weighted
round robin). Credits count only while the same classes contend: when a class starts
or stops waiting, every credit starts again from zero, so no class banks slots while
idle (or alone) and takes a burst of them later.

So, while several classes wait, class ``c`` gets exactly ``weight(c) / sum of their
weights`` of the picks, spread evenly (urgent 8 and batch 1 waiting: 4 urgent picks,
1 batch, 4 urgent, and again): higher classes first in proportion, and a lower class
is never starved (at least one pick in every ``sum of weights`` picks). A class alone is
picked every time. Ties go to the heavier class, then to the name, so the order is
deterministic (tests/unit/test_runner_selection.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Set


def pick(
    weights: Mapping[str, int], credit: Mapping[str, int], waiting: Mapping[str, int]
) -> tuple[str | None, dict[str, int]]:
    """One pick: the class to fetch from (None when none waits) and the new credits.

    ``waiting`` maps a class to how many messages it is known to hold (0 or absent:
    none); ``credit`` is what :func:`pick` returned last time (empty at start).
    """
    eligible = [c for c in weights if waiting.get(c, 0) > 0]
    if not eligible:
        return None, {}
    if set(credit) != set(eligible):
        credit = {}  # the contenders changed: a fresh round, nothing carried over
    new = {c: credit.get(c, 0) + weights[c] for c in eligible}
    chosen = max(eligible, key=lambda c: (new[c], weights[c], c))
    new[chosen] -= sum(weights[c] for c in eligible)
    return chosen, new


def plan(
    weights: Mapping[str, int], credit: Mapping[str, int], waiting: Mapping[str, int], slots: int
) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """``slots`` picks in a row: how many messages to fetch from each class (in the
    order first picked), and the credits after them. A class is not picked more times
    than it holds messages."""
    left = dict(waiting)
    counts: dict[str, int] = {}
    current = dict(credit)
    for _ in range(slots):
        chosen, after = pick(weights, current, left)
        if chosen is None:
            break
        # Credits of classes that ran out in this plan are dropped by the next pick.
        current = after
        counts[chosen] = counts.get(chosen, 0) + 1
        left[chosen] -= 1
    return list(counts.items()), current


def yielded(
    weights: Mapping[str, int], waiting: Mapping[str, int], yielding: Set[str]
) -> tuple[dict[str, int], set[str]]:
    """The classes to share free slots between, and the yielding classes still yielding.

    ``yielding`` holds the classes this runner preempted trials of (for a heavier
    class). While a class heavier than such a class is known to wait, that class gets
    no free slot: its next message is most likely the trial just handed back, which the
    next look would preempt again (work lost twice, a heavier start delayed). Once no
    heavier class waits, it stops yielding and the weighted share applies again; a
    runner that preempted nothing (no preemptible work) shares by weight as always, so
    a lower class is still never starved by heavier classes it cannot be preempted for.
    The heaviest waiting class never yields, so some class is always left to fetch.
    """
    still = {
        c
        for c in yielding
        if any(n > 0 and weights.get(h, 0) > weights.get(c, 0) for h, n in waiting.items())
    }
    return {c: n for c, n in waiting.items() if c not in still}, still
