"""A/B of the importer's CPU per trial: two checkouts of trialbus, alternating, medians.

Not part of ``make bench``: a tool for measuring a change to the importer on a shared
machine, where CPU time per trial compares and wall-clock rates do not. Each round
runs one child process per checkout (``PYTHONPATH`` = that checkout), old then new,
and each child times, in CPU seconds of its own (``time.process_time``), the
importer's per-trial work:

- ``stored``: what one TrialCompleted costs in the importer's worker thread, the
  archive already fetched: ``StoredTrials._unpacked`` (unpack into the job folder)
  and the record built from it, for the trial shapes of ``bench_objects``;
- ``jobdir``: ``trialbus import``'s record building of a Harbor job folder
  (``jobdir._build_all`` over ``scan_job_dir``), no ledger.

Each child also prints a digest of the records it built (their JSON with the
folder paths made relative), so the two checkouts are shown to build the same records.

    python -m benchmarks.ab_importer --old /tmp/old-checkout --new . --mode stored \\
        --shape harbor -n 300 --rounds 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

_CHILD = "--child"
_BLOCK = 50
"""Trials per timed block: a child reports its quickest block, the one least disturbed
by other work on the machine (the median of blocks moved with the load here)."""


def _digest(records: list[Any], root: Path) -> str:
    text = "".join(r.model_dump_json() for r in records).replace(str(root), "<root>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stored(work: Path, shape: str, n: int) -> dict[str, Any]:
    """CPU per trial of unpacking a stored trial and building its record."""
    from benchmarks.bench_objects import make_folder
    from schemas.events import TrialCompleted
    from schemas.objects import ObjectRef
    from services.common.adapters.memory_objects import InMemoryObjectStore
    from services.common.archive import pack_trial
    from services.importer.event_records import _completed_record
    from services.importer.folders import StoredTrials

    data = pack_trial(make_folder(work, shape)).data
    sha = hashlib.sha256(data).hexdigest()
    trials = StoredTrials(InMemoryObjectStore("RESULTS"), work / "jobs")

    def event(i: int) -> TrialCompleted:
        ref = ObjectRef(bucket="RESULTS", name=f"exp/t{i}/1.tar.gz", size=len(data), sha256=sha)
        return TrialCompleted(experiment_id="exp", trial_id=f"t{i}", trial_name=f"t{i}", result=ref)

    events = [event(i) for i in range(2 * n)]
    for ev in events[:n]:  # warm-up: imports, caches, the job folder
        trials._unpacked(ev, data, partial(_completed_record, event=ev))
    records: list[Any] = []
    blocks: list[float] = []
    for start in range(n, 2 * n, _BLOCK):
        block = events[start : start + _BLOCK]
        t0 = time.process_time()
        for ev in block:
            records.append(trials._unpacked(ev, data, partial(_completed_record, event=ev)))
        blocks.append((time.process_time() - t0) / len(block))
    return {"cpu_ms_per_trial": 1000 * min(blocks), "digest": _digest(records, work)}


def _jobdir(job: Path, n: int) -> dict[str, Any]:
    """CPU per trial of building the records of a Harbor job folder (no ledger)."""
    from services.importer.jobdir import _build_all, scan_job_dir

    t0 = time.process_time()
    infos = scan_job_dir(job)[:n]
    records = _build_all(infos, {})
    cpu = time.process_time() - t0
    return {"cpu_ms_per_trial": 1000 * cpu / len(infos), "digest": _digest(records, job)}


def _child(argv: list[str]) -> None:
    mode, arg, n = argv[0], argv[1], int(argv[2])
    if mode == "stored":
        with tempfile.TemporaryDirectory(prefix="ab-importer-") as tmp:
            out = _stored(Path(tmp), arg, n)
    else:
        out = _jobdir(Path(arg), n)
    print(json.dumps(out))


def _run(checkout: Path, mode: str, arg: str, n: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, "-m", "benchmarks.ab_importer", _CHILD, mode, arg, str(n)]
    out = subprocess.run(argv, cwd=checkout, env=env, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the A/B and print each round and the medians (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == _CHILD:
        _child(args[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab_importer")
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code")
    parser.add_argument("--new", type=Path, default=Path.cwd(), help="checkout of the new code")
    parser.add_argument("--mode", choices=("stored", "jobdir"), default="stored")
    parser.add_argument("--shape", default="harbor", help="stored: instant, harbor or agent")
    parser.add_argument("--job", type=Path, help="jobdir: a Harbor job folder")
    parser.add_argument("-n", type=int, default=300, help="trials per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args(args)
    arg = opts.shape if opts.mode == "stored" else str(opts.job)
    samples: dict[str, list[float]] = {"old": [], "new": []}
    digests: dict[str, set[str]] = {"old": set(), "new": set()}
    load = os.getloadavg()[0]
    for i in range(opts.rounds):
        line = []
        for side, checkout in (("old", opts.old), ("new", opts.new)):
            got = _run(checkout.absolute(), opts.mode, arg, opts.n)
            samples[side].append(got["cpu_ms_per_trial"])
            digests[side].add(got["digest"])
            line.append(f"{side} {got['cpu_ms_per_trial']:.3f} ms")
        print(f"round {i + 1}: " + ", ".join(line), flush=True)
    old, new = statistics.median(samples["old"]), statistics.median(samples["new"])
    print(
        f"{opts.mode} {arg}: median CPU per trial old {old:.3f} ms, new {new:.3f} ms "
        f"({new / old:.2f}x); load average before {load:.1f}, after {os.getloadavg()[0]:.1f}"
    )
    same = digests["old"] == digests["new"] and len(digests["old"]) == 1
    print(f"records identical: {same} (old {sorted(digests['old'])}, new {sorted(digests['new'])})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
