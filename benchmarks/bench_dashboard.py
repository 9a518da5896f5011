"""10. The dashboard's experiment page with many trials: time to first paint in Chromium.

One experiment of N trials (10,000; ``TRIALBUS_BENCH_DASHBOARD`` overrides) of the
ledger benchmark's realistic records (four agents with models, usage, phase timings,
a tenth unscored; 500 tasks) is loaded into a fresh embedded ledger (SecantusDB) with
``ensure_indexes``, beside a fresh nats-server. The submitter's HTTP API runs as its
own process (``python -m services.submitter``, no-auth on loopback: the guard's
token check is not what is measured). Debian's chromium, headless, driven by
Playwright, opens ``/ui/experiments/{id}`` in a new browser context each time (no
cache) and reads the page's own Performance API entries:

- ``first-contentful-paint`` (the headline): the browser's first paint of text;
- ``responseStart`` (time to the first byte: the server reading the ledger and
  rendering the page: leaderboard, causes, pass@k, the 500 x 4 matrix, cost, the
  first 100 trial rows), ``domContentLoadedEventEnd`` and ``loadEventEnd``; the HTML's size.

The first load after the API starts is reported on its own (``cold_fcp``,
``cold_ttfb``: templates compiled, the experiment read from the ledger and its page
computed, then kept in the ledger); the headline is the median of the next ``LOADS``,
which the API answers from its report cache (the experiment does not change between
loads). Then a new API process serves one load (``restart_fcp``, ``restart_ttfb``):
its cache is empty, and the page's view is read from the ledger, where the first
process kept it (services/reports/stored.py), instead of 10,000 records. The
page is checked to show N trials done, so a page that failed to render is not timed.
Quick mode (``make bench-quick``, the suite's smoke test) uses 200 trials and fewer
loads; ``TRIALBUS_BENCH_DASHBOARD=10000 python -m benchmarks --quick --only dashboard``
gives the issue's figure in about a minute.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from typing import Any

from benchmarks.bench_ledger import manifest, synthetic_record
from benchmarks.harness import BenchResult, Context, Figure, median
from benchmarks.stack import throwaway_servers
from infra.embedded_stack import stack_env
from infra.managed_process import free_port
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.ports import ExperimentInfo

FULL = 10_000
QUICK = 200
ENV = "TRIALBUS_BENCH_DASHBOARD"
"""Override the number of trials (e.g. ``100000``)."""
LOADS_FULL, LOADS_QUICK = 7, 3
TARGET_MS = 2000.0
"""The page should show something within 2 s, at 10,000 trials, on the embedded ledger."""
DB = "bench"
EXPERIMENT = "exp-dashboard-bench"
LOAD_BATCH = 1000
START_TIMEOUT_S = 120.0

_PAINTED = """() => performance.getEntriesByType('paint')
  .some(e => e.name === 'first-contentful-paint')"""
"""True once chromium has recorded the page's first contentful paint."""

_PERF = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const paint = Object.fromEntries(
    performance.getEntriesByType('paint').map(e => [e.name, e.startTime]));
  return {fcp: paint['first-contentful-paint'] ?? null, fp: paint['first-paint'] ?? null,
          ttfb: nav.responseStart, dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd,
          bytes: nav.decodedBodySize};
}"""


def n_trials(quick: bool) -> int:
    """The experiment's size for this run."""
    return int(os.environ.get(ENV) or (QUICK if quick else FULL))


async def load_ledger(url: str, n: int) -> float:
    """One experiment of ``n`` records; seconds spent writing them."""
    import random

    rng = random.Random(10)
    records = [
        synthetic_record(rng, EXPERIMENT, i, datetime(2026, 11, 1, tzinfo=UTC)) for i in range(n)
    ]
    ledger = MongoLedger(url, DB)
    try:
        await ledger.ensure_indexes()
        t0 = time.perf_counter()
        await ledger.upsert_experiment(
            ExperimentInfo(EXPERIMENT, "dashboard benchmark", n, manifest(EXPERIMENT))
        )
        for start in range(0, n, LOAD_BATCH):
            await ledger.upsert_records(records[start : start + LOAD_BATCH])
        return time.perf_counter() - t0
    finally:
        await ledger.close()


def start_api(nats_url: str, ledger_url: str, port: int) -> subprocess.Popen[bytes]:
    """The submitter's HTTP API as its own process, answering /healthz."""
    env = stack_env(nats_url, ledger_url, "trialbus", DB)
    env.update(
        TRIALBUS_API_NO_AUTH="1",
        TRIALBUS_HTTP_HOST="127.0.0.1",
        TRIALBUS_HTTP_PORT=str(port),
        TRIALBUS_LOG_LEVEL="WARNING",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.submitter"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the HTTP API did not start (exit {proc.poll()})") from None
            time.sleep(0.2)


async def measure(url: str, chromium: str, loads: int, n: int) -> list[dict[str, float]]:
    """``loads + 1`` page loads (the first cold), each in a fresh browser context."""
    from playwright.async_api import async_playwright

    out: list[dict[str, float]] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox"]
        )
        try:
            for _ in range(loads + 1):
                context = await browser.new_context(viewport={"width": 1280, "height": 800})
                page = await context.new_page()
                await page.goto(url, wait_until="load", timeout=300_000)
                done = int(await page.inner_text("[data-count=done]"))
                if done != n:
                    raise AssertionError(f"the page shows {done} trials done, not {n}")
                # Chromium records the paint entry when it paints, which on a busy
                # machine can come after the load event: wait for it, then read.
                await page.wait_for_function(_PAINTED, timeout=120_000)
                perf: dict[str, Any] = await page.evaluate(_PERF)
                if perf["fcp"] is None:
                    raise AssertionError("chromium reported no first-contentful-paint")
                out.append({k: float(v) for k, v in perf.items() if v is not None})
                await context.close()
        finally:
            await browser.close()
    return out


def _with_api(
    nats_url: str, ledger_url: str, chromium: str, loads: int, n: int
) -> list[dict[str, float]]:
    """``measure`` against a new API process, stopped afterwards."""
    port = free_port()
    api = start_api(nats_url, ledger_url, port)
    try:
        url = f"http://127.0.0.1:{port}/ui/experiments/{EXPERIMENT}"
        return asyncio.run(measure(url, chromium, loads, n))
    finally:
        api.terminate()
        try:
            api.wait(timeout=30)
        except subprocess.TimeoutExpired:
            api.kill()


def run(ctx: Context) -> BenchResult:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise RuntimeError("chromium is not installed (`make setup` installs it)")
    n = n_trials(ctx.quick)
    loads = LOADS_QUICK if ctx.quick else LOADS_FULL
    runs: list[dict[str, float]] = []
    for r in range(ctx.runs):
        with throwaway_servers(ctx.path(f"dashboard-{r}")) as (nats_server, ledger):
            ctx.log(f"dashboard run {r + 1}/{ctx.runs}: loading {n:,} records")
            load_s = asyncio.run(load_ledger(ledger.url, n))
            ctx.log(f"dashboard: loaded in {load_s:.0f}s; {loads + 1} page loads")
            samples = _with_api(nats_server.url, ledger.url, chromium, loads, n)
            # A new API process: its cache is empty, the page's view is kept in the ledger.
            restart = _with_api(nats_server.url, ledger.url, chromium, 0, n)[0]
        cold, warm = samples[0], samples[1:]

        def med(key: str, rows: list[dict[str, float]] = warm) -> float:
            return statistics.median(s[key] for s in rows)

        runs.append(
            {
                "fcp": med("fcp"),
                "fcp_min": min(s["fcp"] for s in warm),
                "fcp_max": max(s["fcp"] for s in warm),
                "ttfb": med("ttfb"),
                "dcl": med("dcl"),
                "load": med("load"),
                "html_kib": med("bytes") / 1024,
                "cold_fcp": cold["fcp"],
                "cold_ttfb": cold["ttfb"],
                "restart_fcp": restart["fcp"],
                "restart_ttfb": restart["ttfb"],
                "load_s": load_s,
            }
        )

    def mid(key: str) -> float:
        return median([r[key] for r in runs])

    peers = [
        Figure(
            "ttfb_ms",
            mid("ttfb"),
            "ms",
            "time to the first byte of the warm loads: the page's view from the API's "
            "report cache, then the templates",
        ),
        Figure("dom_content_loaded_ms", mid("dcl"), "ms", "HTML parsed"),
        Figure("load_ms", mid("load"), "ms", "stylesheet and script loaded too"),
        Figure(
            "cold_fcp_ms",
            mid("cold_fcp"),
            "ms",
            "the first load after the API started (its report cache empty)",
        ),
        Figure("cold_ttfb_ms", mid("cold_ttfb"), "ms", "time to the first byte of that load"),
        Figure(
            "restart_fcp_ms",
            mid("restart_fcp"),
            "ms",
            "the first load of a new API process, the page's view kept in the ledger",
        ),
        Figure("restart_ttfb_ms", mid("restart_ttfb"), "ms", "time to the first byte of that load"),
        Figure(
            "fcp_range_ms",
            mid("fcp_max") - mid("fcp_min"),
            "ms",
            f"max - min of the {loads} warm loads ({mid('fcp_min'):.0f} to {mid('fcp_max'):.0f})",
        ),
        Figure("html_kib", mid("html_kib"), "KiB", "the page's HTML, uncompressed"),
        Figure("ledger_load_s", mid("load_s"), "s", f"{n:,} records written (setup, not timed)"),
    ]
    return BenchResult(
        name="dashboard",
        title=f"Dashboard: the experiment page's first contentful paint, {n:,} trials",
        value=mid("fcp"),
        unit="ms",
        target=TARGET_MS,
        target_op="<=",
        runs=[r["fcp"] for r in runs],
        peers=peers,
        config={
            "trials": n,
            "page_loads": loads,
            "browser": "Debian chromium, headless (Playwright, executable_path)",
            "ledger": "SecantusDB (embedded)",
            "api": "python -m services.submitter, no-auth on loopback",
            "runs": ctx.runs,
        },
    )
