"""Weighted deficit round robin between priority classes (services/runner/selection.py),
and the operator's class settings (services/common/priority.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from services.common.priority import PriorityClasses
from services.runner.selection import pick, plan, yielded

W = {"urgent": 8, "normal": 3, "batch": 1}


def picks(weights: dict[str, int], waiting: dict[str, int], n: int) -> list[str]:
    """``n`` single picks in a row (a runner of concurrency 1), consuming the queues."""
    left, out = dict(waiting), []
    credit: dict[str, int] = {}
    for _ in range(n):
        chosen, credit = pick(weights, credit, left)
        if chosen is None:
            break
        out.append(chosen)
        left[chosen] -= 1
    return out


def test_a_class_alone_is_picked_every_time() -> None:
    for cls in W:
        assert picks(W, {cls: 5}, 5) == [cls] * 5
    assert pick(W, {}, {}) == (None, {})
    assert pick(W, {"urgent": 3}, {"urgent": 0}) == (None, {})


def test_shares_follow_the_weights_while_all_classes_wait() -> None:
    order = picks(W, {c: 1000 for c in W}, 12 * 50)
    assert Counter(order) == {"urgent": 400, "normal": 150, "batch": 50}
    # Spread evenly, not in blocks: every window of 12 picks holds each share exactly.
    for i in range(0, len(order), 12):
        assert Counter(order[i : i + 12]) == {"urgent": 8, "normal": 3, "batch": 1}


def test_urgent_goes_first_and_batch_is_never_starved() -> None:
    order = picks({"urgent": 8, "batch": 1}, {"urgent": 20, "batch": 20}, 18)
    # Spread evenly: one batch pick in every 9 while urgent still waits (the fifth).
    assert order[:9] == ["urgent"] * 4 + ["batch"] + ["urgent"] * 4
    assert order[9:] == order[:9]
    # Negative controls: equal weights alternate; a huge weight starves batch for
    # as long as the urgent queue lasts (what the no-starvation assertion rules out).
    assert picks({"urgent": 1, "batch": 1}, {"urgent": 4, "batch": 4}, 4) == [
        "urgent",
        "batch",
        "urgent",
        "batch",
    ]
    assert "batch" not in picks({"urgent": 1000, "batch": 1}, {"urgent": 20, "batch": 20}, 20)


def test_an_idle_class_banks_no_credit() -> None:
    # Batch alone for a while, then urgent arrives: urgent is not owed the picks it
    # missed, and batch keeps its 1-in-9 share.
    credit: dict[str, int] = {}
    for _ in range(50):
        chosen, credit = pick({"urgent": 8, "batch": 1}, credit, {"batch": 100})
        assert chosen == "batch"
    assert credit == {"batch": 0}
    # A credit left from before (urgent and normal contended) is dropped too.
    credit = {"batch": 5, "normal": -5}
    order = []
    for _ in range(9):
        chosen, credit = pick({"urgent": 8, "batch": 1}, credit, {"urgent": 100, "batch": 100})
        assert chosen is not None
        order.append(chosen)
    assert order == ["urgent"] * 4 + ["batch"] + ["urgent"] * 4


def test_plan_spreads_free_slots_and_never_asks_a_class_for_more_than_it_holds() -> None:
    counts, credit = plan(W, {}, {"urgent": 2, "normal": 10, "batch": 10}, 12)
    # Urgent runs out after 2; the other 10 slots go 3:1 (rounded by the pick order).
    assert dict(counts) == {"urgent": 2, "normal": 8, "batch": 2}
    assert counts[0][0] == "urgent"  # in the order first picked
    counts, _ = plan(W, {}, {"batch": 1}, 4)
    assert counts == [("batch", 1)]
    # The credits carry over from one plan to the next: 12 single-slot plans give the
    # same shares as one plan of 12.
    credit = {}
    total: Counter[str] = Counter()
    for _ in range(12):
        step, credit = plan(W, credit, {c: 100 for c in W}, 1)
        total.update(dict(step))
    assert total == {"urgent": 8, "normal": 3, "batch": 1}


def test_priority_class_settings() -> None:
    classes = PriorityClasses.parse(" batch=1, urgent=8,normal=3 ")
    assert classes.names == ("urgent", "normal", "batch")
    assert classes.default == "normal" and classes.resolve(None) == "normal"
    assert classes.durable_class("normal") is None and classes.durable_class("urgent") == "urgent"
    assert classes.refusal(None) is None and classes.refusal("batch") is None
    refusal = classes.refusal("vip")
    assert refusal is not None and "compute.priority_class" in refusal and "'vip'" in refusal
    for spec, problem in (
        ("urgent=8,urgent=1,normal=1", "twice"),
        ("urgent=0,normal=1", "not in 1-1000"),
        ("urgent,normal=1", "whole number"),
        ("Urgent=1,normal=1", "must match"),
        ("", "no priority class"),
        ("urgent=2", "default priority class 'normal'"),
    ):
        with pytest.raises(ValueError, match=problem):
            PriorityClasses.parse(spec)


# -- a class preempted here yields free slots to the heavier class it was preempted for --


def test_a_preempted_class_yields_while_a_heavier_class_waits() -> None:
    waiting = {"urgent": 5, "batch": 900}
    shared, still = yielded(W, waiting, {"batch"})
    assert shared == {"urgent": 5} and still == {"batch"}
    # Every free slot goes to urgent then, not one in 9 to batch (whose next message is
    # the trial just handed back, preempted again at the next look).
    order = picks(W, shared, 9)
    assert order == ["urgent"] * 5
    # Negative control: the same queues, nothing preempted here: the weighted share.
    shared, still = yielded(W, waiting, set())
    assert shared == waiting and still == set()
    assert "batch" in picks(W, shared, 9)


def test_a_yielding_class_is_served_again_once_no_heavier_class_waits() -> None:
    # urgent served (its count read 0, or not known to wait): batch stops yielding for
    # good, until the next preemption marks it again.
    shared, still = yielded(W, {"batch": 900}, {"batch"})
    assert shared == {"batch": 900} and still == set()
    shared, still = yielded(W, {"urgent": 0, "batch": 900}, {"batch"})
    assert shared == {"urgent": 0, "batch": 900} and still == set()
    # Only heavier classes hold it back: a lighter or equal class waiting does not.
    shared, still = yielded(W, {"normal": 4, "batch": 3}, {"normal"})
    assert shared == {"normal": 4, "batch": 3} and still == set()
    assert yielded({"a": 2, "b": 2}, {"a": 1, "b": 1}, {"a"}) == ({"a": 1, "b": 1}, set())


def test_the_heaviest_waiting_class_never_yields() -> None:
    # normal was preempted for urgent, batch for normal: with all three waiting only
    # urgent is shared; with urgent gone, normal takes the slots and batch still yields.
    all3 = {"urgent": 2, "normal": 2, "batch": 2}
    assert yielded(W, all3, {"normal", "batch"}) == ({"urgent": 2}, {"normal", "batch"})
    rest = {"normal": 2, "batch": 2}
    assert yielded(W, rest, {"normal", "batch"}) == ({"normal": 2}, {"batch"})
    # Whatever yields, something is left to fetch while anything waits.
    for marks in ({"urgent"}, {"urgent", "normal", "batch"}):
        shared, _ = yielded(W, all3, marks)
        assert shared
