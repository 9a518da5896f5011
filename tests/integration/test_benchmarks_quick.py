"""The benchmarks' quick mode runs end to end, so the benchmark code cannot rot.

It checks that every benchmark ran and reported sane numbers, not that the targets
are met (that is what ``make bench`` on a quiet machine is for).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
NAMES = [
    "overhead",
    "capacity",
    "pipeline",
    "submit",
    "import",
    "latency",
    "objects",
    "ledger",
    "dispatch",
    "dashboard",
    "scheduling",
    "fleet",
    "live",
    "handoff",
]


def test_quick_benchmarks_write_every_result(tmp_path: Path) -> None:
    results, doc = tmp_path / "results.json", tmp_path / "performance.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--work-dir",
            str(tmp_path / "work"),
            "--results",
            str(results),
            "--doc",
            str(doc),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(results.read_text())
    assert report["mode"] == "quick"
    assert [b["name"] for b in report["benchmarks"]] == NAMES
    for bench in report["benchmarks"]:
        assert "error" not in bench, bench.get("traceback")
        assert {"value", "unit", "target", "target_op", "met", "peers"} <= set(bench)
        assert math.isfinite(bench["value"]) and bench["unit"]
        for figure in bench["peers"]:
            assert math.isfinite(figure["value"]), figure
    by_name = {b["name"]: b for b in report["benchmarks"]}
    for name in (
        "pipeline",
        "import",
        "capacity",
        "objects",
        "ledger",
        "dispatch",
        "dashboard",
        "scheduling",
    ):
        assert by_name[name]["value"] > 0, by_name[name]
    # Orchestration capacity counts every trial's starts: none may be started twice.
    capacity = {f["name"]: f["value"] for f in by_name["capacity"]["peers"]}
    twice = {k: v for k, v in capacity.items() if k.startswith("started_more_than_once")}
    assert twice and all(v == 0 for v in twice.values()), capacity
    assert 0 < by_name["submit"]["value"] < 60
    assert 0 < by_name["latency"]["value"] < 1000
    # The scheduling scenarios saw both teams' starts: shares of a real window.
    scheduling = {f["name"]: f["value"] for f in by_name["scheduling"]["peers"]}
    assert 0 < scheduling["b_share_of_starts"] <= 1, scheduling
    assert scheduling["share_team-a"] + scheduling["share_team-b"] == pytest.approx(1.0)
    # Nothing a preemptible A handed back was lost or counted as a failed attempt, and a
    # non-preemptible A was never preempted. Whether A is preempted at all in a quick
    # run is timing: with 1 s trials, B often finds slots freed by A's wave before the
    # runner's look (0.5-1.5 s); tests/e2e/test_preemption.py holds the batch trials
    # so that preemption must happen, and checks it there.
    assert "preempted_trials" in scheduling, scheduling  # reported, whatever its value
    assert scheduling["preempted_lost"] == 0 and scheduling["preempted_counted"] == 0
    assert scheduling["nonpreempt_preempted_trials"] == 0, scheduling
    # The simulated fleet took the work through the runners' own pull loop, without
    # a refused pull.
    fleet = {f["name"]: f["value"] for f in by_name["fleet"]["peers"]}
    assert fleet["runners_used_8c"] >= 1 and fleet["fetch_failures_8c"] == 0, fleet
    assert fleet["pulls_held_8c"] > 0, fleet
    # Raw ceilings are measured beside the pipeline in the same run.
    ceilings = {f["name"] for f in by_name["pipeline"]["peers"]}
    assert {"jetstream_publish_ceiling", "ledger_bulk_upsert_ceiling"} <= ceilings
    page = doc.read_text()
    assert "| benchmark | measured | target |" in page
    assert all(f"| {name}:" in page for name in NAMES)
