"""``python -m benchmarks``: run the benchmarks, write results.json and the report.

Full mode (``make bench``) writes ``benchmarks/results.json`` and
``docs/performance.md``; quick mode (``make bench-quick``, tiny sizes, one run)
writes under ``.trialbus/bench-quick/`` unless told otherwise, so it never
overwrites the published numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, Context
from benchmarks.report import write_outputs
from benchmarks.suite import BENCHMARKS, run_all


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one run (about a minute)")
    p.add_argument("--runs", type=int, help="runs per measurement (default: 3, quick: 1)")
    p.add_argument(
        "--only",
        help=f"comma-separated subset of: {', '.join(BENCHMARKS)}",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
    )
    p.add_argument(
        "--mongo-url",
        default=os.environ.get("TRIALBUS_BENCH_MONGO_URL"),
        help="also import into this MongoDB (env TRIALBUS_BENCH_MONGO_URL)",
    )
    p.add_argument("--work-dir", type=Path, help="scratch folder (emptied per measurement)")
    p.add_argument("--results", type=Path, help="results.json path")
    p.add_argument("--doc", type=Path, help="markdown report path")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other benchmarks of an existing results file (replace only those run)",
    )
    args = p.parse_args(argv)
    unknown = set(args.only or []) - set(BENCHMARKS)
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    out = REPO / ".trialbus" / ("bench-quick" if args.quick else "bench")
    args.work_dir = (args.work_dir or out / "work").resolve()
    if args.quick:
        args.results = args.results or out / "results.json"
        args.doc = args.doc or out / "performance.md"
    else:
        args.results = args.results or REPO / "benchmarks" / "results.json"
        args.doc = args.doc or REPO / "docs" / "performance.md"
    args.runs = args.runs or (1 if args.quick else 3)
    return args


def merge_reports(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the benchmarks of ``old`` it did not run, in the suite's order.

    Each benchmark keeps its own start time, command and load average, so a page built
    from several sittings still says when and under what load each number was taken.
    """
    by_name = {b["name"]: b for b in old.get("benchmarks", [])}
    by_name.update({b["name"]: b for b in new["benchmarks"]})
    commands = [c for c in (old.get("command", ""), new["command"]) if c]
    return {
        **new,
        "command": " ; ".join(dict.fromkeys(" ; ".join(commands).split(" ; "))),
        "started_at": min(old.get("started_at", new["started_at"]), new["started_at"]),
        "seconds": old.get("seconds", 0) + new["seconds"],
        "runs": new["runs"] if old.get("runs") == new["runs"] else "as each section says",
        "benchmarks": [by_name[n] for n in BENCHMARKS if n in by_name],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(REPO)  # services and Harbor's environment import path resolve from here
    command = "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    ctx = Context(
        work_dir=args.work_dir, quick=args.quick, runs=args.runs, mongo_url=args.mongo_url
    )
    report = run_all(ctx, only=args.only, command=command.strip())
    if args.merge and args.results.exists():
        report = merge_reports(json.loads(args.results.read_text()), report)
    write_outputs(report, args.results, args.doc)
    print(
        f"{len(report['benchmarks'])} benchmarks in {time.perf_counter() - t0:.0f}s; "
        f"wrote {args.results} and {args.doc}",
        file=sys.stderr,
    )
    failed = [b["name"] for b in report["benchmarks"] if b.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
