"""A trial forked from the runner's forkserver pays nothing the forkserver could pay once.

Every attempt runs in a process forked from the forkserver (services.runner.isolation);
what a trial imports or builds on first use is paid again in every such process. The
forkserver's preload (services.runner.forkserver_preload) does it once: a real local
trial forked from it imports no module and compiles no seccomp filter. The control
forks the same trial from a parent that only imported the trial machinery: there the
trial imports dirhash (Harbor's task hash), compiles the filter and builds Harbor's
models left unbuilt at import (TrialLock among them) itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.sandbox_env import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]


def forked_trial(mode: str, work: Path) -> dict[str, Any]:
    """Run tests.support.first_use_trial in its own process; its report."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.first_use_trial", mode, str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kind"] == "completed", report
    return report


def test_a_trial_forked_from_the_forkserver_imports_and_compiles_nothing(tmp_path: Path) -> None:
    report = forked_trial("forkserver", tmp_path)
    assert report["new"] == [], "imported by the trial, not the forkserver: " + ", ".join(
        report["new"]
    )
    assert report["seccomp_compiled_in_trial"] == 0
    assert report["models_built_in_trial"] == [], report["models_built_in_trial"]


def test_control_a_bare_parent_leaves_first_use_to_every_trial(tmp_path: Path) -> None:
    report = forked_trial("bare", tmp_path)
    assert "dirhash" in report["new"]
    assert report["seccomp_compiled_in_trial"] == 1
    assert "TrialLock" in report["models_built_in_trial"], report["models_built_in_trial"]
