"""Writing a run's report: ``results.json`` (machine-readable) and the markdown page.

The page's numbers all come from the report; the explanations around them (method,
where the time goes, what limits each number) live in ``benchmarks.prose``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import model, prose
from benchmarks.suite import BENCHMARKS

BUSY_LOAD = 1.0
"""1-minute load average above which the page says the machine was busy."""


def fmt(value: float, unit: str) -> str:
    """A value with its unit, rounded for reading."""
    if unit == "%":
        return f"{value:+.1f} %"
    if unit in ("ratio", "efficiency", "fraction"):
        return f"{value:.2f}"
    if unit == "s":
        return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    if unit == "ms":
        return f"{value:.2f} ms" if value < 1 else f"{value:.1f} ms"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"


def _target(op: str | None, target: float | None, unit: str) -> str:
    if op is None or target is None:
        return ""
    return f"{op} {fmt(target, unit)}"


def _met(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: ""}[met]


def summary_table(report: dict[str, Any]) -> str:
    """One row per benchmark: measured, target, met, the figures beside it."""
    rows = [
        "| benchmark | measured | target | | measured beside it (same run) |",
        "|---|---|---|---|---|",
    ]
    for b in report["benchmarks"]:
        if "error" in b:
            rows.append(f"| {b['name']} | error: {b['error']} | | | |")
            continue
        key = prose.KEY_PEERS.get(b["name"], [])
        beside = "; ".join(
            f"{p['name'].replace('_', ' ')} {fmt(p['value'], p['unit'])}"
            + (
                f" (target {_target(p['target_op'], p['target'], p['unit'])}: {_met(p['met'])})"
                if p.get("target") is not None
                else ""
            )
            for p in b["peers"]
            if p["name"] in key
        )
        rows.append(
            f"| {b['name']}: {b['title']} | {fmt(b['value'], b['unit'])} | "
            f"{_target(b['target_op'], b['target'], b['unit'])} | {_met(b['met'])} | {beside} |"
        )
    return "\n".join(rows)


def detail(b: dict[str, Any]) -> str:
    """A benchmark's section: configuration, every figure, per-run values, analysis."""
    out = [f"### {b['name']}: {b.get('title', '')}", ""]
    if "error" in b:
        out += [f"This benchmark failed in this run: `{b['error']}`.", ""]
        return "\n".join(out)
    out += [_what(b["name"]), ""]
    config = ", ".join(f"{k} = {v}" for k, v in b["config"].items())
    runs = ", ".join(fmt(v, b["unit"]) for v in b["runs"][:12])
    more = f" ... ({len(b['runs'])} values)" if len(b["runs"]) > 12 else ""
    out += [
        f"Configuration: {config}. Took {b['seconds']:.0f} s"
        + (f", started {b['started_at']} (`{b['command']}`)" if "started_at" in b else "")
        + f"; 1-minute load average before it: {b['load_average_before'][0]:.2f}.",
        "",
        f"**{fmt(b['value'], b['unit'])}** "
        f"(target {_target(b['target_op'], b['target'], b['unit'])}, {_met(b['met'])}); "
        f"per run: {runs}{more}.",
        "",
        "| figure | value | target | note |",
        "|---|---|---|---|",
    ]
    for p in b["peers"]:
        target = _target(p.get("target_op"), p.get("target"), p["unit"])
        if target:
            target += f" ({_met(p['met'])})"
        out.append(f"| {p['name']} | {fmt(p['value'], p['unit'])} | {target} | {p['note']} |")
    for note in b.get("notes", []):
        out += ["", f"Note: {note}"]
    out += ["", prose.LIMITS.get(b["name"], "").strip(), ""]
    return "\n".join(out)


def _what(name: str) -> str:
    """A benchmark's description: its module's docstring, minus the title line."""
    bench = BENCHMARKS.get(name)
    doc = (sys.modules[bench.__module__].__doc__ or "") if bench else ""
    return doc.split("\n", 1)[1].strip() if "\n" in doc else doc.strip()


def render_markdown(report: dict[str, Any]) -> str:
    """The whole docs/performance.md page."""
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    load = report["load_average"]
    busy = (
        max(
            load["before"][0],
            load["after"][0],
            *(b.get("load_average_before", [0])[0] for b in report["benchmarks"]),
        )
        > BUSY_LOAD
    )
    env = ", ".join(f"`{k}={v}`" for k, v in report["environment"].items())
    parts = [
        prose.TITLE.strip(),
        "",
        "## This run",
        "",
        f"- Command: `{report['command']}` ({report['mode']} mode, median of "
        f"{report['runs']} run(s) per measurement), started {report['started_at']}, "
        f"took {report['seconds'] / 60:.1f} min."
        if " ; " not in report["command"]
        else f"- Merged from {report['command'].count(' ; ') + 1} sittings (`--merge`; "
        f"each section names its command, start and load), the first started "
        f"{report['started_at']}, {report['seconds'] / 60:.1f} min of benchmarks in all.",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"{m['os']}, Python {m['python']}.",
        f"- Versions: {versions}.",
        f"- Environment of both sides: {env}.",
        f"- Load average (1/5/15 min) before: {_load(load['before'])}, after: "
        f"{_load(load['after'])}."
        + (
            " **The machine was busy during this run** (other work on its two cores); "
            "numbers are lower than on an idle machine."
            if busy
            else ""
        ),
        "",
        summary_table(report),
        "",
        prose.MISSES.strip(),
        "",
        prose.METHOD.strip(),
        "",
        "## The benchmarks",
        "",
    ]
    parts += [detail(b) for b in report["benchmarks"]]
    parts += [model.render(report), prose.ORCHESTRATION.strip(), ""]
    parts += [prose.BEFORE_AFTER.strip(), ""]
    parts += [prose.SCALING.strip(), "", prose.REPRODUCE.strip(), ""]
    return "\n".join(parts)


def _load(values: list[float] | tuple[float, ...]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def write_outputs(report: dict[str, Any], results_path: Path, doc_path: Path) -> None:
    """Write results.json and the markdown page (creating their folders)."""
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(report, indent=2) + "\n")
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    doc_path.write_text(render_markdown(report))
