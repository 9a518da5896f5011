"""The sandbox security tests drive ``LocalEnvironment`` through tests/support/sandbox_env.

Importing the fixtures here makes ``layers`` and ``make_env`` available to every test
in this folder; ``policy_runner`` starts runner processes under a policy file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.service_process import ServiceProcess
from schemas.subjects import Topology
from tests.support.runner_policy import StartRunner, start_runner
from tests.support.sandbox_env import layers, make_env

__all__ = ["layers", "make_env", "policy_runner"]


@pytest.fixture
def policy_runner(
    tmp_path: Path, nats_url: str, ledger_url: str, topology: Topology
) -> Iterator[StartRunner]:
    """Starts runner processes under a policy file, on this test's NATS and ledger
    (tests.support.runner_policy.start_runner); each is stopped at teardown."""
    started: list[ServiceProcess] = []

    def start(policy: Path, runner_id: str, **extra_env: str) -> ServiceProcess:
        proc = start_runner(
            tmp_path,
            policy,
            runner_id=runner_id,
            nats_url=nats_url,
            ledger_url=ledger_url,
            prefix=topology.prefix,
            **extra_env,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
