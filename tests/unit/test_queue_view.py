"""The queue's rows (services/reports/queue.py): counts per subject and lease in, what
waits per pool, class and team and why out. Each reason has a control that differs by
the one thing the reason looks at."""

from __future__ import annotations

from typing import Any

from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.fair_share import TeamShare, mark_key
from services.common.ports import ExperimentInfo
from services.common.priority import PriorityClasses
from services.common.quotas import Quotas, TeamQuota
from services.reports.queue import (
    REASONS,
    capped_teams,
    lease_counts,
    parse_work_subject,
    queue_view,
    share_judge,
)

T = Topology("qv")
CLASSES = PriorityClasses.parse("urgent=8,normal=3,batch=1")
LOCAL = RunnerInfo(runner_id="r1", host="h", capabilities=["local"], concurrency=2)


def info(exp: str, team: str | None, **compute: Any) -> ExperimentInfo:
    by = {"user": "u", **({"team": team} if team else {})}
    return ExperimentInfo(exp, f"name-{exp}", 10, {"compute": compute, "submitted_by": by})


def view(
    work: dict[str, int],
    infos: dict[str, ExperimentInfo | None],
    *,
    leases: dict[str, int] | None = None,
    paused: dict[str, bool] | None = None,
    runners: list[RunnerInfo] | None = None,
    one_by_one: dict[str, int] | None = None,
    capped: dict[str, str] | None = None,
) -> dict[str, Any]:
    v = queue_view(
        T,
        CLASSES,
        work,
        leases or {},
        infos,
        paused or {},
        [LOCAL] if runners is None else runners,
        one_by_one,
        capped,
    )
    return {e.experiment_id: e for e in v.experiments} | {"_groups": v.groups}


def test_subjects_and_leases_are_parsed() -> None:
    assert parse_work_subject(T, "qv.work.default.e1") == ("default", None, "e1")
    assert parse_work_subject(T, "qv.work.gpu.batch.e2") == ("gpu", "batch", "e2")
    assert parse_work_subject(T, "other.work.default.e1") is None
    assert parse_work_subject(T, "qv.work.a.b.c.d") is None
    held = lease_counts("QV_LEASES", {"$KV.QV_LEASES.e1.0": 1, "$KV.QV_LEASES.e1.3": 1})
    assert held == {"e1": 2}
    assert lease_counts("QV_LEASES", {"$KV.QV_LEASES.e1.0": 0, "$KV.OTHER.e2.0": 1}) == {}


def test_each_reason_and_its_control() -> None:
    work = {
        "qv.work.default.urgent.p": 3,
        "qv.work.default.urgent.p2": 3,
        "qv.work.gpu.n": 2,
        "qv.work.default.batch.c": 5,
        "qv.work.default.batch.c2": 5,
        "qv.work.default.q": 4,
    }
    infos: dict[str, ExperimentInfo | None] = {
        "p": info("p", "red", priority_class="urgent"),
        "p2": info("p2", "red", priority_class="urgent"),
        "n": info("n", "red", pool="gpu"),
        "c": info("c", "blue", priority_class="batch", n_concurrent_trials=2),
        "c2": info("c2", "blue", priority_class="batch", n_concurrent_trials=2),
        "q": info("q", None),
    }
    rows = view(work, infos, leases={"c": 2, "c2": 1}, paused={"p": True})
    assert rows["p"].reason == "paused" and "trialbus resume p" in rows["p"].detail
    assert rows["p2"].reason == "priority"  # control: not paused
    assert rows["n"].reason == "no_runner" and "pool 'gpu'" in rows["n"].detail
    assert rows["c"].reason == "concurrency_limit" and (rows["c"].queued, rows["c"].running) == (
        3,
        2,
    )
    assert rows["c2"].reason == "priority" and rows["c2"].queued == 4  # control: 1 of 2 runs
    assert (rows["q"].priority_class, rows["q"].team, rows["q"].reason) == (
        "normal",
        None,
        "priority",
    )
    # A live runner in the gpu pool: the same experiment waits only its turn.
    gpu = RunnerInfo(runner_id="g", host="h", pool="gpu", capabilities=["local"], concurrency=1)
    assert view(work, infos, runners=[LOCAL, gpu])["n"].reason == "priority"
    # Groups per (pool, class, team), classes by weight, reasons counted in trials.
    groups = [
        (g.pool, g.priority_class, g.team, g.queued, g.running, g.experiments, g.by_reason)
        for g in rows["_groups"]
    ]
    assert groups == [
        ("default", "urgent", "red", 6, 0, 2, {"paused": 3, "priority": 3}),
        ("default", "normal", None, 4, 0, 1, {"priority": 4}),
        ("default", "batch", "blue", 7, 3, 2, {"concurrency_limit": 3, "priority": 4}),
        ("gpu", "normal", "red", 2, 0, 1, {"no_runner": 2}),
    ]


def test_a_team_at_its_spend_cap_is_the_reason_and_one_under_it_is_not() -> None:
    assert REASONS.index("team_spend_cap") == REASONS.index("paused") + 1
    quotas = Quotas(
        teams={
            "red": TeamQuota(max_spend_usd_per_day=5),
            "blue": TeamQuota(max_spend_usd_per_day=5),
        }
    )
    # red has reached its cap; blue is a cent under it (control); green has no cap.
    capped = capped_teams(quotas, {"red": 5.0, "blue": 4.99, "green": 100.0})
    assert set(capped) == {"red"}
    assert "'red'" in capped["red"] and "$5.0000 of $5" in capped["red"]
    work = {
        "qv.work.default.r": 2,
        "qv.work.default.rp": 2,
        "qv.work.gpu.rn": 2,
        "qv.work.default.b": 2,
        "qv.work.default.g": 2,
    }
    infos: dict[str, ExperimentInfo | None] = {
        "r": info("r", "red"),
        "rp": info("rp", "red"),
        "rn": info("rn", "red", pool="gpu"),
        "b": info("b", "blue"),
        "g": info("g", "green"),
    }
    rows = view(work, infos, paused={"rp": True}, capped=capped)
    assert rows["r"].reason == "team_spend_cap" and rows["r"].detail == capped["red"]
    assert rows["rp"].reason == "paused"  # a pause comes first
    assert rows["rn"].reason == "team_spend_cap"  # before no_runner
    assert rows["b"].reason == "priority"  # control: the same cap, not reached
    assert rows["g"].reason == "priority"
    group = next(g for g in rows["_groups"] if (g.pool, g.team) == ("default", "red"))
    assert group.by_reason == {"paused": 2, "team_spend_cap": 2}
    # Control: without the capped teams (no quotas file) the reason never appears.
    assert view(work, infos)["r"].reason == "priority"


def test_running_trials_are_not_queued_and_unknown_experiments_still_show() -> None:
    # Every message of "all" is a running trial: nothing of it waits.
    rows = view({"qv.work.default.all": 2, "qv.work.default.x": 1}, {}, leases={"all": 2})
    assert "all" not in rows
    assert (rows["x"].name, rows["x"].team, rows["x"].n_concurrent_trials) == ("x", None, None)
    assert view({}, {})["_groups"] == []


def test_trials_paused_one_by_one_are_the_reason_only_when_they_are_all_that_waits() -> None:
    work = {"qv.work.default.a": 2, "qv.work.default.b": 2}
    infos: dict[str, ExperimentInfo | None] = {"a": info("a", "red"), "b": info("b", "red")}
    rows = view(work, infos, one_by_one={"a": 2, "b": 1})
    assert rows["a"].reason == "paused" and "--trial" in rows["a"].detail
    assert rows["a"].paused_trials == 2
    # Control: one of b's two queued trials is not paused, so b waits its turn too.
    assert (rows["b"].reason, rows["b"].paused_trials) == ("priority", 1)


def test_the_cli_tables_show_groups_reasons_and_names_as_text() -> None:
    from rich.console import Console

    from services.cli_live import queue_tables

    work = {"qv.work.default.batch.e1": 2, "qv.work.gpu.e2": 1}
    infos: dict[str, ExperimentInfo | None] = {
        "e1": ExperimentInfo("e1", "[red]sweep[/red]", 2, {"submitted_by": {"team": "blue"}}),
        "e2": info("e2", "red", pool="gpu"),
    }
    v = queue_view(T, CLASSES, work, {}, infos, {"e1": True}, [LOCAL])
    console = Console(width=250, record=True)
    for table in queue_tables(v):
        console.print(table)
    text = console.export_text()
    assert "queue: 3 trials wait" in text and "paused 2" in text and "no_runner 1" in text
    assert "[red]sweep[/red]" in text  # a name is text, never markup


def test_a_team_over_its_fair_share_is_the_reason_while_another_team_waits() -> None:
    assert REASONS.index("over_share") == REASONS.index("concurrency_limit") + 1
    work = {"qv.work.default.batch.r": 10, "qv.work.default.batch.b": 5}
    infos: dict[str, ExperimentInfo | None] = {
        "r": info("r", "red", priority_class="batch"),
        "b": info("b", "blue", priority_class="batch"),
    }
    shares: dict[str, TeamShare | None] = {"r": TeamShare("red", 3.0), "b": TeamShare("blue", 1.0)}
    # red runs 4 (4/3 per share), blue 0 with work queued: red is over its share.
    marks = {mark_key("default", "batch", "red", f"run{i}"): 1 for i in range(4)}

    def rows(marks: dict[str, int], paused: dict[str, bool] | None = None) -> dict[str, Any]:
        judge = share_judge(T, CLASSES, work, shares, paused or {}, marks)
        v = queue_view(T, CLASSES, work, {}, infos, paused or {}, [LOCAL], over_share=judge)
        return {e.experiment_id: e for e in v.experiments}

    over = rows(marks)
    assert over["r"].reason == "over_share" and "team 'blue' waits" in over["r"].detail
    assert over["b"].reason == "priority"  # blue is below its share
    # Controls: red at 3 (its 3:1 share of 4 slots) ties blue's next and is not held
    # back; with blue paused nothing rivals red.
    marks3 = dict(list(marks.items())[:3]) | {mark_key("default", "batch", "blue", "b0"): 1}
    assert rows(marks3)["r"].reason == "priority"
    assert rows(marks, paused={"b": True})["r"].reason == "priority"
    # Without the judge (no fair share read) the reason never appears.
    assert view(work, infos)["r"].reason == "priority"
