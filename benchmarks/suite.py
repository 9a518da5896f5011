"""The list of benchmarks and the loop that runs them into one report."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks import (
    bench_capacity,
    bench_dashboard,
    bench_dispatch,
    bench_fleet,
    bench_handoff,
    bench_import,
    bench_latency,
    bench_ledger,
    bench_live,
    bench_objects,
    bench_overhead,
    bench_pipeline,
    bench_scheduling,
    bench_submit,
)
from benchmarks.harness import (
    BenchResult,
    Context,
    fresh_dir,
    load_average,
    machine_info,
    prepare_environment,
    warm_bytecode_cache,
)

BENCHMARKS: dict[str, Callable[[Context], BenchResult]] = {
    "overhead": bench_overhead.run,
    "capacity": bench_capacity.run,
    "pipeline": bench_pipeline.run,
    "submit": bench_submit.run,
    "import": bench_import.run,
    "latency": bench_latency.run,
    "objects": bench_objects.run,
    "ledger": bench_ledger.run,
    "dispatch": bench_dispatch.run,
    "dashboard": bench_dashboard.run,
    "scheduling": bench_scheduling.run,
    "fleet": bench_fleet.run,
    "live": bench_live.run,
    "handoff": bench_handoff.run,
}
"""Name -> benchmark, in the order of the issue that asked for them."""


def run_all(ctx: Context, *, only: list[str] | None, command: str) -> dict[str, Any]:
    """Run the selected benchmarks (all when ``only`` is None) with ``ctx``; a failing
    one is recorded, the others still run."""
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    fresh_dir(ctx.work_dir)
    env_changes = prepare_environment()
    ctx.log("warming the bytecode cache (both sides share it)")
    warm_bytecode_cache()
    load_before = load_average()
    results: list[dict[str, Any]] = []
    for name, bench in BENCHMARKS.items():
        if only and name not in only:
            continue
        b0 = time.perf_counter()
        load = load_average()
        try:
            entry = bench(ctx).as_json()
        except Exception as exc:  # noqa: BLE001 - reported in results, the run goes on
            ctx.log(f"{name} FAILED: {type(exc).__name__}: {exc}")
            entry = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            entry["traceback"] = traceback.format_exc()
        entry["seconds"] = round(time.perf_counter() - b0, 1)
        entry["started_at"] = datetime.fromtimestamp(time.time() - entry["seconds"], UTC).isoformat(
            timespec="seconds"
        )
        entry["command"] = command
        entry["load_average_before"] = load
        results.append(entry)
        ctx.log(f"{name}: done in {entry['seconds']:.0f}s")
    return {
        "command": command,
        "mode": "quick" if ctx.quick else "full",
        "runs": ctx.runs,
        "started_at": started.isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine_info(),
        "environment": env_changes,
        "load_average": {"before": load_before, "after": load_average()},
        "benchmarks": results,
    }
