"""Terminal-Bench-style tasks through the whole trialbus pipeline in the local environment.

The tasks in tests/fixtures/tasks exercise what the local environment imitates:
Dockerfile replay (apt-get, pip, COPY, ENV, WORKDIR, ARG), a verifier that gets
pytest with uvx, a server on a fixed port in concurrent repetitions, writes outside
the trial's overlay, an agent phase without the network between a setup and a verifier
with it, an allowlist (only its hosts, through the sandbox's egress proxy), and a
failing RUN step. Each runs with the oracle (must score
1.0) and nop (must score 0.0) agents, twice, submitted through the real CLI to the
embedded stack; the failing build must end unscored as an infrastructure failure,
not retried. The host must be unchanged afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.stack import EmbeddedStack
from schemas.events import Event, ResultImported
from services.localenv.images import resolve_base
from services.localenv.sandbox import missing_host_tools
from tests.e2e.cli import ROOT
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.support.runner_policy import policy_env
from tests.support.sandbox_env import host_processes

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or bool(missing_host_tools(network=True)),
        reason="needs root and bwrap/slirp4netns/util-linux (make setup)",
    ),
]

TASKS = ROOT / "tests" / "fixtures" / "tasks"
SCORED = (
    "dockerfile-replay",
    "uvx-verifier",
    "fixed-port",
    "escape-attempt",
    "phase-network",
    "allowlist-network",
)
PROBE = "trialbus-escape-probe"
PROBE_DIRS = ("/usr/bin", "/usr/local/lib", "/etc", "/var/lib", "/opt", "/root", str(ROOT))
CHECKOUT = "@CHECKOUT@"
"""Placeholder in the escape-attempt task for this clone's folder (filled in at test time)."""


def copy_tasks(dest: Path) -> Path:
    """The fixture tasks, with the escape probe aimed at this checkout, wherever it is."""
    shutil.copytree(TASKS, dest, ignore=shutil.ignore_patterns("conftest.py", "__pycache__"))
    for path in (dest / "escape-attempt").rglob("*"):
        if path.is_file() and CHECKOUT.encode() in path.read_bytes():
            path.write_text(path.read_text().replace(CHECKOUT, str(ROOT)))
    return dest


def host_snapshot() -> dict[str, Any]:
    """What a trial could have changed on the host: packages, files, the Python it used."""
    python = resolve_base("python:3.12-slim").python
    assert python is not None
    site = Path(python.prefix) / "lib" / "python3.12" / "site-packages"

    def listing(folder: str | Path) -> list[str]:
        path = Path(folder)
        return sorted(os.listdir(path)) if path.is_dir() else []

    return {
        "dpkg_status": hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest(),
        "dpkg_info": len(listing("/var/lib/dpkg/info")),
        "usr_bin": listing("/usr/bin"),
        "usr_local": {d: listing(f"/usr/local/{d}") for d in ("bin", "lib", "share")},
        "etc": listing("/etc"),
        "var_lib": listing("/var/lib"),
        "python_site_packages": listing(site),
        "probes": [d for d in PROBE_DIRS if Path(d, PROBE).exists()],
        "tree_installed": Path("/usr/bin/tree").exists(),
    }


def layer_cache_policy(tmp_path: Path) -> dict[str, str]:
    """Runner environment whose policy allows a layer cache under ``tmp_path`` (a host
    path, which the default policy refuses)."""
    return policy_env(
        tmp_path / "policy", environments={"local": {"path_kwargs": {"cache_dir": [str(tmp_path)]}}}
    )


def local_manifest(
    tmp_path: Path,
    name: str,
    tasks: Sequence[str],
    *,
    agents: Sequence[str],
    repetitions: int,
    concurrency: int,
    retry: dict[str, int],
) -> Path:
    """A manifest running ``tasks`` (fixture tasks copied under ``tmp_path``) in the local
    environment, its layer cache in ``tmp_path/layers``; written to ``tmp_path``."""
    folder = copy_tasks(tmp_path / "tasks")
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "tasks": [str(folder / task) for task in tasks],
                "agents": [{"name": agent} for agent in agents],
                "repetitions": repetitions,
                "compute": {
                    "environment": "local",
                    "n_concurrent_trials": concurrency,
                    "environment_kwargs": {"cache_dir": str(tmp_path / "layers")},
                },
                "retry": retry,
            }
        )
    )
    return manifest


def assert_nothing_left(stack: EmbeddedStack, before: dict[str, Any]) -> None:
    """No trial folder is left in ``stack`` and the host is as :func:`host_snapshot`
    saw it ``before`` the trials."""
    sandboxes = stack.data_dir / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
    assert host_snapshot() == before


async def test_local_tasks_end_to_end(stacks: Stacks, tmp_path: Path) -> None:
    stack = await stacks.start(concurrency=4, runner_env=layer_cache_policy(tmp_path))
    cli = stacks.cli(stack)
    before = host_snapshot()
    manifest = local_manifest(
        tmp_path,
        "local-environment-tasks",
        (*SCORED, "failing-run"),
        agents=("oracle", "nop"),
        repetitions=2,
        concurrency=4,
        retry={"max_attempts": 3, "backoff_seconds": 1},
    )
    proc = cli.run("submit", str(manifest), "--wait", "--json", timeout=600)
    # The failing build leaves unscored trials: exit code 1, as for any unscored trial.
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["n_trials"] == 28 and summary["status"]["recorded"] == 28

    records = await ledger_records(stack, summary["experiment_id"])
    outcomes: dict[tuple[str, str], list[Any]] = {}
    for rec in records:
        key = (rec.provenance.task_name, rec.provenance.agent_name)
        outcomes.setdefault(key, []).append(rec)
    for task in SCORED:
        for agent, reward in (("oracle", 1.0), ("nop", 0.0)):
            got = [
                (r.evaluation.main_reward, r.evaluation.failure_class)
                for r in outcomes[task, agent]
            ]
            assert got == [(reward, "none")] * 2, (task, agent, outcomes[task, agent])
    for agent in ("oracle", "nop"):
        for rec in outcomes["failing-run", agent]:
            ev = rec.evaluation
            assert (ev.main_reward, ev.reward_valid, ev.failure_class) == (
                None,
                False,
                "infrastructure",
            )
            assert ev.exception_type == "DockerfileBuildError"
            assert "exit code 3" in (ev.exception_message or "")
            assert rec.attempts == 1  # a failed RUN is deterministic: never retried
            trial_dir = Path(rec.artifacts.trial_dir or "")
            assert "something went wrong" in (trial_dir / "environment-build.log").read_text()

    # Each record names the task archive its runner ran (Harbor's own checksum of the
    # folder names none), so a finished trial is retried from anywhere: here from the
    # checkout, where the manifest's task folders are not. Before, the retry was refused.
    for rec in records:
        assert rec.provenance.task_archive is not None, rec.trial_id
        assert rec.provenance.task_archive != rec.provenance.task_checksum
    tap = await stacks.tap(stack)
    [again] = outcomes["dockerfile-replay", "oracle"][:1]
    answer = cli.json("retry", summary["experiment_id"], again.trial_id, "--json")
    assert answer["run_id"].startswith(f"{again.trial_id}:retry:")

    def retried(events: Sequence[Event]) -> bool:
        # The retry's own import: the tap replays the stream's history too.
        return any(
            isinstance(e, ResultImported)
            and (e.trial_id, e.correlation_id) == (again.trial_id, answer["correlation_id"])
            for e in events
        )

    await tap.eventually(retried, "the retry's import", 300)
    [after] = [r for r in await ledger_records(stack, summary["experiment_id"])
               if r.trial_id == again.trial_id]  # fmt: skip
    assert after.evaluation.main_reward == 1.0
    assert after.timing.finished_at > again.timing.finished_at

    # Nothing left behind: no trial folders, no servers, the host as it was.
    assert host_processes("http.server 8765") == []
    assert_nothing_left(stack, before)
