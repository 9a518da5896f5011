"""``trialbus report EXP --png FILE`` on a real ledger, as a user runs it: the file is a
PNG of plausible size and shape, and the numbers drawn in it (carried in its
``trialbus-report`` text chunk, ``services.reports.plots.plot_data``) are those of
``trialbus report EXP --json`` from the same ledger. Controls: one changed reward
changes the figure's numbers and pixels; a file that is not a PNG is refused by the
reader; a folder that does not exist is a clear error, exit 2; other commands never
import matplotlib.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas.record import Provenance, TrialRecord
from services.common.ports import ExperimentInfo
from services.reports.plots import METADATA_KEY, OUTCOME_STYLE, png_metadata
from tests.e2e.cli import ROOT, run_module
from tests.support.records import single_reward
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

AGENTS = ("oracle", "nop", "coin")


def _records(exp: str, flip: bool = False) -> list[TrialRecord]:
    """5 tasks x 3 agents x 2 repetitions: oracle passes, nop fails, coin passes every
    other attempt and one infrastructure failure; ``flip``: one of nop's attempts passes."""
    out = []
    for t in range(5):
        for agent in AGENTS:
            for rep in range(2):
                reward: float | None = {"oracle": 1.0, "nop": 0.0, "coin": float(rep)}[agent]
                failure = "none"
                if agent == "coin" and t == 4 and rep == 1:
                    reward, failure = None, "infrastructure"
                if flip and agent == "nop" and t == 0 and rep == 0:
                    reward = 1.0
                out.append(
                    TrialRecord(
                        trial_id=f"{exp}-{agent}-{t}-{rep}",
                        experiment_id=exp,
                        status="complete",
                        provenance=Provenance(task_name=f"task-{t}", agent_name=agent),
                        evaluation=single_reward(reward, failure),  # type: ignore[arg-type]
                    )
                )
    return out


async def _store(servers: Servers, exp: str, records: list[TrialRecord]) -> None:
    ledger = servers.ledger()
    try:
        await ledger.ensure_indexes()
        await ledger.upsert_experiment(ExperimentInfo(exp, "png", len(records), {}))
        await ledger.upsert_records(records)
    finally:
        await ledger.close()


def _report(env: dict[str, str], exp: str, png: Path) -> dict[str, Any]:
    """``trialbus report EXP --png FILE --json``: the JSON it printed (same read)."""
    done = run_module(env, "report", exp, "--png", str(png), "--json")
    assert done.returncode == 0, done.stderr
    assert f"wrote {png}" in done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _drawn(png: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(png_metadata(png.read_bytes())[METADATA_KEY])
    return found


def _expected(report: dict[str, Any]) -> dict[str, Any]:
    """What the figure must show, read from the report's JSON independently of plots.py."""

    def label(r: dict[str, Any]) -> str:
        return f"{r['agent']}@{r['model']}" if r.get("model") else r["agent"]

    keys = ("mean_reward", "mean_reward_ci", "pass_rate", "pass_rate_ci", "n_scored", "too_few")
    return {
        "bars": [{"label": label(r), **{k: r[k] for k in keys}} for r in report["leaderboard"]],
        "cells": [
            [(c["outcome"], c["n_passed"], c["n_scored"]) for c in t["cells"]]
            for t in report["tasks"]
        ],
        "tasks": [t["task"] for t in report["tasks"]],
    }


def _shown(drawn: dict[str, Any]) -> dict[str, Any]:
    keys = ("label", "mean_reward", "mean_reward_ci", "pass_rate", "pass_rate_ci")
    return {
        "bars": [{k: b[k] for k in (*keys, "n_scored", "too_few")} for b in drawn["bars"]],
        "cells": [
            [(c["outcome"], c["n_passed"], c["n_scored"]) for c in row] for row in drawn["cells"]
        ],
        "tasks": drawn["tasks"],
    }


async def test_png_shows_the_reports_numbers(tmp_path: Path, servers: Servers) -> None:
    from PIL import Image

    env = servers.cli(prefix="png").env
    await _store(servers, "png-a", _records("png-a"))
    await _store(servers, "png-b", _records("png-b", flip=True))
    a_png, b_png = tmp_path / "a.png", tmp_path / "b.png"
    a_report = await asyncio.to_thread(_report, env, "png-a", a_png)
    b_report = await asyncio.to_thread(_report, env, "png-b", b_png)

    # A real PNG of plausible size and shape: a figure, not an empty canvas.
    body = a_png.read_bytes()
    assert body[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < len(body) < 3_000_000, len(body)
    with Image.open(io.BytesIO(body)) as image:
        image.load()
        assert image.format == "PNG"
        width, height = image.size
        assert width >= 1000 and 600 <= height <= 4000, image.size
        colours = {c for _, c in image.convert("RGB").getcolors(maxcolors=1 << 20) or []}
    # The matrix's Okabe-Ito fills are drawn (passed, failed, mixed all occur here).
    for outcome in ("passed", "failed", "mixed"):
        fill = OUTCOME_STYLE[outcome][0]
        rgb = tuple(int(fill[i : i + 2], 16) for i in (1, 3, 5))
        assert rgb in colours, (outcome, fill)

    # Its numbers are the report's, as `report --json` printed them.
    drawn = _drawn(a_png)
    assert drawn["experiment_id"] == "png-a"
    assert _shown(drawn) == _expected(a_report)
    rows = {r["agent"]: r for r in a_report["leaderboard"]}
    assert rows["coin"]["unscored_by_cause"] == {"infrastructure": 1}
    assert rows["oracle"]["mean_reward"] == 1.0 and rows["nop"]["mean_reward"] == 0.0

    # Control: one of nop's attempts passes in png-b: other numbers, other pixels.
    assert _shown(_drawn(b_png)) == _expected(b_report)
    assert _shown(_drawn(b_png)) != _shown(drawn)
    assert b_png.read_bytes() != body
    b_rows = {r["agent"]: r for r in b_report["leaderboard"]}
    assert b_rows["nop"]["mean_reward"] == pytest.approx(0.1)

    # Control: the reader refuses what is not a PNG.
    with pytest.raises(ValueError, match="not a PNG"):
        png_metadata(b"<html>not a picture</html>")


async def test_png_into_a_missing_folder_is_a_clear_error(tmp_path: Path, servers: Servers) -> None:
    env = servers.cli(prefix="png").env
    await _store(servers, "png-c", _records("png-c"))
    target = tmp_path / "no-such-folder" / "x.png"
    done = await asyncio.to_thread(run_module, env, "report", "png-c", "--png", str(target))
    assert done.returncode == 2, done.stderr
    assert f"cannot write {target}" in done.stderr
    # Control: into a folder that exists, the same command writes the file.
    ok = tmp_path / "x.png"
    done = await asyncio.to_thread(run_module, env, "report", "png-c", "--png", str(ok))
    assert done.returncode == 0 and ok.stat().st_size > 20_000, done.stderr


def test_other_commands_do_not_import_matplotlib() -> None:
    probe = (
        "import sys, services.cli, services.reports.plots, services.reports.html\n"
        "print('matplotlib' in sys.modules)\n"
        "from services.reports.plots import render_png\n"
        "from tests.support.records import report_record, single_reward\n"
        "from services.reports.report import build_report\n"
        "render_png(build_report('e', [report_record(single_reward(1.0))], None))\n"
        "print('matplotlib' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # Not imported by the CLI or the report modules; imported by rendering (control).
    assert done.stdout.split() == ["False", "True"]
