"""A self-contained HTML page of an experiment's report: inline CSS and SVG, no scripts,
no external assets, so it renders offline and can be attached to a CI run.

Rendered from ``services.reports.report.build_report``'s data; no arithmetic here
beyond placing numbers on a scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any, Final

from services.reports import formatting as fmt

_CSS: Final = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;
margin:24px auto;max-width:1200px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#57606a;margin:0 0 16px}
table{border-collapse:collapse;margin:4px 0 8px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:middle}
th{background:#f6f8fa;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.few{color:#8c6d1f;font-style:italic}
.few-bar svg{opacity:.4}
.heat td.c{text-align:center;min-width:72px;font-variant-numeric:tabular-nums}
.est{white-space:nowrap}
.wide{overflow-x:auto}
.heat td.none{background:repeating-linear-gradient(45deg,#f6f8fa,#f6f8fa 4px,#eaeef2 4px,
#eaeef2 8px);color:#57606a}
.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;vertical-align:-2px;margin-right:4px;
border:1px solid #8c959f}
.note{color:#57606a;font-size:12.5px;max-width:900px}
"""

_CAUSE_COLOURS: Final = {
    "agent": "#bf8700",
    "verifier": "#8250df",
    "infrastructure": "#cf222e",
    "cancelled": "#6e7781",
    "invalid_reward": "#57606a",
    "no_reward": "#424a53",
}
_PASSED, _FAILED, _PENDING = "#1a7f37", "#8c959f", "#ffffff"


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _too_few(row: dict[str, Any]) -> str:
    return f'<span class="few">{_e(fmt.too_few(row, "too few scored"))}</span>'


def heat_colour(rate: float) -> tuple[str, str]:
    """(background, text) for a pass rate in [0, 1]: a light-to-dark blue scale."""
    lo, hi = (247, 251, 255), (8, 48, 107)
    rgb = tuple(round(a + (b - a) * rate) for a, b in zip(lo, hi, strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb), "#ffffff" if rate > 0.55 else "#1b1f24"


def interval_svg(
    value: float, ci: Sequence[float] | None, scale: tuple[float, float], width: int = 160
) -> str:
    """A horizontal interval bar: axis, the 95% interval, the point estimate."""
    lo, hi = scale
    pad, h = 8, 22

    def x(v: float) -> float:
        return pad + (v - lo) / (hi - lo) * (width - 2 * pad)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
        f'role="img" aria-label="{_e(fmt.with_ci(value, ci))}">',
        f'<line x1="{pad}" x2="{width - pad}" y1="{h - 4}" y2="{h - 4}" stroke="#d0d7de"/>',
    ]
    for tick in (lo, (lo + hi) / 2, hi):
        parts.append(
            f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{h - 7}" y2="{h - 1}" '
            'stroke="#d0d7de"/>'
        )
    if ci is not None:
        parts.append(
            f'<rect x="{x(ci[0]):.1f}" y="6" width="{max(x(ci[1]) - x(ci[0]), 1.5):.1f}" '
            'height="8" rx="3" fill="#54aeff" fill-opacity="0.55"/>'
        )
    parts.append(f'<circle cx="{x(value):.1f}" cy="10" r="4" fill="#0550ae"/></svg>')
    return "".join(parts)


def outcome_svg(row: dict[str, Any], n_max: int, width: int = 160) -> str:
    """Stacked bar of a row's trials: passed, not passed, unscored by cause, pending."""
    segments = [
        (row["n_passed"], _PASSED, "passed"),
        (row["n_scored"] - row["n_passed"], _FAILED, "scored, not passed"),
    ]
    for cause, n in row["unscored_by_cause"].items():
        segments.append((n, _CAUSE_COLOURS.get(cause, "#57606a"), f"unscored: {cause}"))
    segments.append((row["n_pending"], _PENDING, "pending"))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="16">']
    x, unit = 0.0, width / max(n_max, 1)
    for n, colour, label in segments:
        if n <= 0:
            continue
        parts.append(
            f'<rect x="{x:.1f}" y="1" width="{n * unit:.1f}" height="14" fill="{colour}" '
            f'stroke="#8c959f" stroke-width="0.5"><title>{_e(label)}: {n}</title></rect>'
        )
        x += n * unit
    parts.append("</svg>")
    return "".join(parts)


def _scale(rows: Sequence[dict[str, Any]]) -> tuple[float, float]:
    lows = [r["mean_reward_ci"][0] for r in rows if r.get("mean_reward_ci")]
    highs = [r["mean_reward_ci"][1] for r in rows if r.get("mean_reward_ci")]
    lo, hi = min([0.0, *lows]), max([1.0, *highs])
    return (lo, hi if hi > lo else lo + 1.0)


def _label(row: dict[str, Any]) -> str:
    return _e(row["agent"]) + (f"<br><small>{_e(row['model'])}</small>" if row["model"] else "")


def leaderboard_html(rows: Sequence[dict[str, Any]]) -> str:
    """The leaderboard table with interval bars and outcome bars."""
    scale = _scale(rows)
    n_max = max((r["n_trials"] for r in rows), default=1)
    out = [
        '<div class="wide"><table><tr><th>#</th><th>agent</th><th>scored / total</th>'
        "<th>trials</th>"
        "<th>unscored (cause)</th><th>mean reward [95% CI]</th>"
        f"<th>interval ({fmt.num(scale[0])} to {fmt.num(scale[1])})</th>"
        "<th>pass rate [95% CI]</th><th>pass@k</th>"
    ]
    with_cost = fmt.shows_cost(rows)
    out.append("<th>cost (per scored trial)</th></tr>" if with_cost else "</tr>")
    for i, r in enumerate(rows, 1):
        causes = fmt.unscored(r, _e)
        if r["mean_reward"] is None:
            mean_cell = rate_cell = _too_few(r)
            bar = ""
        else:
            mean_cell = fmt.with_ci(r["mean_reward"], r.get("mean_reward_ci"))
            bar = interval_svg(r["mean_reward"], r.get("mean_reward_ci"), scale)
            rate_cell = fmt.with_ci(r["pass_rate"], r.get("pass_rate_ci"), pct=True)
            if r["too_few"]:  # shown, greyed, with why: never hidden
                mean_cell = f'<span class="few">{mean_cell}</span><br>{_too_few(r)}'
                rate_cell = f'<span class="few">{rate_cell}</span><br>{_too_few(r)}'
                bar = f'<span class="few-bar">{bar}</span>'

        pak = r.get("pass_at_k") or {}
        pak_cell = ", ".join(f"@{k}&nbsp;{v:.3f}" for k, v in pak.items()) or "-"
        out.append(
            f"<tr><td class=n>{i}</td><td>{_label(r)}</td>"
            f"<td class=n>{r['n_scored']} / {r['n_trials']}</td>"
            f"<td>{outcome_svg(r, n_max)}</td><td>{causes}</td><td class=est>{mean_cell}</td>"
            f"<td>{bar}</td><td class=est>{rate_cell}</td><td>{pak_cell}</td>"
            + (f"<td class=est>{fmt.cost(r)}</td></tr>" if with_cost else "</tr>")
        )
    out.append("</table></div>")
    legend = [(_PASSED, "passed"), (_FAILED, "scored, not passed")]
    legend += [(c, f"unscored: {k}") for k, c in _CAUSE_COLOURS.items() if k != "none"]
    legend.append((_PENDING, "pending"))
    out.append(
        '<p class="legend note">'
        + "".join(
            f'<span><i class="sw" style="background:{c}"></i>{_e(t)}</span>' for c, t in legend
        )
        + "</p>"
    )
    return "".join(out)


def heatmap_html(report: dict[str, Any]) -> str:
    """Per task x agent: cells coloured by the observed pass rate, labelled passed/scored."""
    rows = report["leaderboard"]
    out = ['<table class="heat"><tr><th>task</th>']
    out += [f"<th>{_label(r)}</th>" for r in rows]
    out.append("</tr>")
    for task in report["tasks"]:
        out.append(f"<tr><th>{_e(task['task'])}</th>")
        for c in task["cells"]:
            unscored = c["n_recorded"] - c["n_scored"]
            extra = f"<br><small>+{unscored} unscored</small>" if unscored else ""
            if not c["n_scored"]:
                out.append(f'<td class="c none">no scored trial{extra}</td>')
                continue
            bg, fg = heat_colour(c["n_passed"] / c["n_scored"])
            out.append(
                f'<td class="c" style="background:{bg};color:{fg}">'
                f"{c['n_passed']}/{c['n_scored']}{extra}</td>"
            )
        out.append("</tr>")
    out.append("</table>")
    scale = "".join(
        f'<i class="sw" style="background:{heat_colour(v / 4)[0]}"></i>{v * 25}% ' for v in range(5)
    )
    out.append(
        f'<p class="note">Cells show passed / scored attempts, coloured by that fraction: '
        f"{scale}. They are counts, not estimates: a task rarely has the "
        f"{report['scoring']['min_scored']} scored attempts an estimate needs. Unscored "
        "attempts are listed apart and never coloured as failures.</p>"
    )
    return "".join(out)


def failures_html(report: dict[str, Any]) -> str:
    """Exceptions by class and type, with whether they were scored."""
    failures = report["failures"]
    if not failures:
        return '<p class="note">No trial raised an exception.</p>'
    out = [
        "<table><tr><th>class</th><th>exception</th><th>trials</th><th>scored?</th>"
        "<th>by agent</th></tr>"
    ]
    for f in failures:
        colour = _CAUSE_COLOURS.get(f["failure_class"], "#57606a")
        scored = "yes (the agent's failure)" if f["scored"] else "no"
        by_agent = ", ".join(f"{_e(a)}: {n}" for a, n in f["by_agent"].items())
        out.append(
            f'<tr><td><i class="sw" style="background:{colour}"></i>{_e(f["failure_class"])}</td>'
            f"<td><code>{_e(f['exception_type'])}</code></td><td class=n>{f['count']}</td>"
            f"<td>{scored}</td><td>{by_agent}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def render_html(report: dict[str, Any]) -> str:
    """The whole page."""
    s, rules = report["status"], report["scoring"]
    name = report.get("name")
    title = f"trialbus report: {report['experiment_id']}" + (f" ({name})" if name else "")
    summary = (
        f"{s['scored']} scored of {s['total']} trials; {s['unscored']} unscored "
        f"(never counted as zeros), {s['pending']} pending."
    )
    if fmt.shows_cost(report["leaderboard"]):
        summary += f" Cost: {fmt.total_cost(report)}."
    rules_text = (
        f"Scored trials only: a valid reward (including the agent's own timeouts and "
        f"refusals); infrastructure, verifier and cancelled trials are unscored. Pass: main "
        f"reward &ge; {rules['pass_threshold']}. Intervals are {rules['confidence']:.0%}: "
        "Wilson for pass rates and for 0/1 rewards, otherwise a percentile bootstrap "
        f"({rules['bootstrap_resamples']} resamples, seed {rules['bootstrap_seed']}). "
        f"Estimates need at least {rules['min_scored']} scored trials. pass@k is the "
        "unbiased estimator averaged over tasks. Ranked by the interval's lower bound. "
        "See docs/scoring.md."
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1><p class=sub>{_e(summary)}</p>"
        "<h2>Leaderboard</h2>"
        f"{leaderboard_html(report['leaderboard'])}"
        "<h2>Pass rate per task</h2>"
        f"{heatmap_html(report)}"
        "<h2>Failure causes</h2>"
        f"{failures_html(report)}"
        f'<h2>How these numbers are computed</h2><p class="note">{rules_text}</p>'
        "</body></html>\n"
    )
