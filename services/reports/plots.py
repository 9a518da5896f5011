"""The report as one PNG: the leaderboard with its 95% intervals as error bars, and the
task x agent matrix, for papers and pull-request comments (``trialbus report --png``).

Drawn from ``services.reports.report.build_report``'s data, the structure the CLI
tables, the HTML page and the JSON API render, through ``plot_data``: a pure, typed
copy of the numbers the figure shows. The PNG carries that copy as JSON in a text
chunk (``METADATA_KEY``), so a reader (a test, a CI job) can check the picture's
numbers against ``report --json`` without reading pixels.

matplotlib (Agg backend, object API: no pyplot, no global figure state) is imported
inside ``render_png`` only: importing it costs about a second here, which no other
command should pay. Colours are Okabe-Ito (colour-blind safe) and never alone: each
matrix cell carries a symbol and its counts, each bar its numbers, a too-few row
says so in words.
"""

from __future__ import annotations

import io
import json
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Final

from services.reports.formatting import num, row_agent

METADATA_KEY: Final = "trialbus-report"
"""The PNG text chunk holding ``plot_data``'s JSON."""
MATRIX_TASKS_MAX: Final = 60
"""Tasks drawn in the matrix (by name); past it the figure says how many are left out
(``trialbus report`` lists every one)."""
DPI: Final = 120

# Okabe & Ito (2008): distinguishable with every common colour-vision deficiency.
BLUE, ORANGE, GREEN, VERMILLION, YELLOW, GREY = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#F0E442",
    "#999999",
)
OUTCOME_STYLE: Final[dict[str, tuple[str, str]]] = {
    # outcome -> (fill, symbol); unscored is hatched grey: never drawn as a failure.
    "passed": (GREEN, "✓"),
    "mixed": (YELLOW, "◐"),
    "failed": (VERMILLION, "✗"),
    "unscored": ("#DDDDDD", "⊘"),
    "pending": ("#F2F2F2", "…"),
}


@dataclass(frozen=True, slots=True)
class Bar:
    """One leaderboard row as drawn: its label, estimates and 95% intervals."""

    label: str
    mean_reward: float | None
    mean_reward_ci: list[float] | None
    pass_rate: float | None
    pass_rate_ci: list[float] | None
    n_scored: int
    n_trials: int
    too_few: bool


@dataclass(frozen=True, slots=True)
class Cell:
    """One task x agent cell: the report's outcome and counts."""

    outcome: str
    n_passed: int
    n_scored: int
    n_recorded: int


@dataclass(frozen=True, slots=True)
class PlotData:
    """Every number the PNG shows, copied from the report (no arithmetic)."""

    experiment_id: str
    name: str | None
    bars: list[Bar]
    agents: list[str]
    tasks: list[str]
    cells: list[list[Cell]]
    tasks_hidden: int

    def as_json(self) -> str:
        """The JSON the PNG carries (``METADATA_KEY``)."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def plot_data(report: dict[str, Any]) -> PlotData:
    """The figure's numbers from ``build_report``'s data: the leaderboard's rows in its
    order, the matrix's first ``MATRIX_TASKS_MAX`` tasks."""
    board = report["leaderboard"]
    shown = report["tasks"][:MATRIX_TASKS_MAX]
    return PlotData(
        experiment_id=report["experiment_id"],
        name=report.get("name"),
        bars=[
            Bar(
                label=row_agent(r),
                mean_reward=r["mean_reward"],
                mean_reward_ci=r["mean_reward_ci"],
                pass_rate=r["pass_rate"],
                pass_rate_ci=r["pass_rate_ci"],
                n_scored=r["n_scored"],
                n_trials=r["n_trials"],
                too_few=r["too_few"],
            )
            for r in board
        ],
        agents=[row_agent(r) for r in board],
        tasks=[t["task"] for t in shown],
        cells=[
            [Cell(c["outcome"], c["n_passed"], c["n_scored"], c["n_recorded"]) for c in t["cells"]]
            for t in shown
        ],
        tasks_hidden=len(report["tasks"]) - len(shown),
    )


def _axis(bars: list[Bar]) -> tuple[float, float]:
    """[0, 1] widened to hold every mean and interval (rewards need not lie in [0, 1])."""
    ends = [v for b in bars for v in (b.mean_reward_ci or [])]
    ends += [b.mean_reward for b in bars if b.mean_reward is not None]
    return min([0.0, *ends]), max([1.0, *ends])


def _bar_words(b: Bar) -> str:
    def est(value: float | None, ci: list[float] | None) -> str:
        if value is None:
            return "-"
        return f"{num(value)} [{num(ci[0])}, {num(ci[1])}]" if ci else num(value)

    few = " · too few" if b.too_few else ""
    return (
        f"mean {est(b.mean_reward, b.mean_reward_ci)} · pass "
        f"{est(b.pass_rate, b.pass_rate_ci)} · {b.n_scored}/{b.n_trials} scored{few}"
    )


def _draw_leaderboard(ax: Any, data: PlotData) -> None:
    low, high = _axis(data.bars)
    pad = (high - low) * 0.03  # a marker at an end of the axis stays whole
    n = len(data.bars)
    for i, b in enumerate(data.bars):
        y = n - 1 - i  # the leaderboard's first row on top
        alpha = 0.4 if b.too_few else 1.0
        for value, ci, dy, colour, marker in (
            (b.mean_reward, b.mean_reward_ci, 0.12, BLUE, "o"),
            (b.pass_rate, b.pass_rate_ci, -0.12, ORANGE, "s"),
        ):
            if value is None:
                continue
            err = [[value - ci[0]], [ci[1] - value]] if ci else None
            ax.errorbar(
                [value], [y + dy], xerr=err, fmt=marker, color=colour, ecolor=colour,
                capsize=4, markersize=6, alpha=alpha, linewidth=1.6,
            )  # fmt: skip
        ax.text(high + 2 * pad, y, _bar_words(b), va="center", fontsize=8, alpha=alpha)
    ax.set_yticks(range(n), [b.label for b in reversed(data.bars)], fontsize=9)
    ax.set_xlim(low - pad, high + pad)
    ax.set_ylim(-0.7, n - 0.3)
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_xlabel("mean reward (●, blue) and pass rate (■, orange), 95% intervals", fontsize=9)
    title = f"{data.name} ({data.experiment_id})" if data.name else data.experiment_id
    ax.set_title(f"Leaderboard: {title}", fontsize=11, loc="left")


def _draw_matrix(ax: Any, data: PlotData) -> None:
    from matplotlib.patches import Rectangle

    rows, cols = len(data.tasks), len(data.agents)
    for r, cells in enumerate(data.cells):
        for c, cell in enumerate(cells):
            fill, symbol = OUTCOME_STYLE.get(cell.outcome, ("#FFFFFF", "?"))
            ax.add_patch(
                Rectangle(
                    (c, r), 1, 1, facecolor=fill, edgecolor="#FFFFFF", linewidth=1.5,
                    hatch="///" if cell.outcome == "unscored" else None,
                )
            )  # fmt: skip
            words = f"{symbol} {cell.n_passed}/{cell.n_scored}" if cell.n_scored else symbol
            ax.text(c + 0.5, r + 0.5, words, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, max(cols, 1))
    ax.set_ylim(max(rows, 1), 0)
    ax.set_xticks(
        [c + 0.5 for c in range(cols)],
        data.agents,
        fontsize=8,
        rotation=30,
        ha="left",
        rotation_mode="anchor",
    )
    ax.set_yticks([r + 0.5 for r in range(rows)], data.tasks, fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    more = f"; {data.tasks_hidden} more tasks in `trialbus report`" if data.tasks_hidden else ""
    ax.set_xlabel(
        "✓ all scored attempts passed · ◐ some · ✗ none · ⊘ unscored (hatched) · … no record"
        f"; passed/scored{more}",
        fontsize=8,
    )


def render_png(report: dict[str, Any]) -> bytes:
    """The report's figure as PNG bytes (see the module doc)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = plot_data(report)
    board_h = 1.3 + 0.45 * max(len(data.bars), 1)
    matrix_h = 1.4 + 0.28 * max(len(data.tasks), 1)
    # Wide enough for the labels and the numbers beside the bars (~0.065 in per
    # character at 8-9 pt), and for 1.1 in per matrix column.
    chars = max((len(b.label) + len(_bar_words(b)) for b in data.bars), default=0)
    task_chars = max((len(t) for t in data.tasks), default=0)
    width = max(10.0, 0.07 * chars + 4.5, 0.065 * task_chars + 1.1 * len(data.agents) + 1.0)
    fig = Figure(figsize=(width, board_h + matrix_h), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, height_ratios=[board_h, matrix_h])
    _draw_leaderboard(top, data)
    _draw_matrix(bottom, data)
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": "trialbus", METADATA_KEY: data.as_json()})
    return out.getvalue()


def png_metadata(png: bytes) -> dict[str, str]:
    """The text chunks of a PNG (tEXt, zTXt, iTXt uncompressed); ValueError naming the
    problem when ``png`` is not a PNG."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG file (its first 8 bytes are not the PNG signature)")
    out: dict[str, str] = {}
    pos = 8
    while pos + 8 <= len(png):
        size = int.from_bytes(png[pos : pos + 4], "big")
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + size]
        pos += 12 + size
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _tkey, _, text = rest.partition(b"\0")
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode(
                "utf-8"
            )
        elif kind == b"IEND":
            break
    return out
