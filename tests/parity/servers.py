"""The production servers, started from their official images with testcontainers.

compose.yaml is the production shape, and the source of truth here: the images, the
MongoDB replica-set command and the NATS nodes' configuration files
(infra/nats/nats-{1,2,3}.conf) are read from it, so the parity tests follow any change
to production instead of keeping a copy that drifts.

Nothing here touches Docker at import time: testcontainers connects when a container is
built, which the fixtures (tests/parity/conftest.py) do only after the engine answered.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml
from pymongo import MongoClient
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network
from testcontainers.core.wait_strategies import HttpWaitStrategy, LogMessageWaitStrategy

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
NATS_NODES = ("nats-1", "nats-2", "nats-3")
NATS_CONF_IN_CONTAINER = "/etc/nats/nats.conf"
MONGO_SERVICE = "mongo"
MONGO_PORT = 27017
NATS_CLIENT_PORT = 4222
NATS_MONITOR_PORT = 8222
STARTUP_S = 180
"""Per wait (a first start may include an image pull on a slow link)."""


def compose_service(name: str) -> dict[str, Any]:
    """Service ``name`` of compose.yaml, its ``<<`` merge keys resolved (PyYAML does)."""
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    if name not in services:
        raise KeyError(f"{COMPOSE_FILE}: no service {name!r} (have {sorted(services)})")
    return services[name]


def nats_conf(node: str) -> Path:
    """The host file compose.yaml mounts at the node's config path."""
    for volume in compose_service(node)["volumes"]:
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == NATS_CONF_IN_CONTAINER:
            return (ROOT / source).resolve()
    raise KeyError(f"{COMPOSE_FILE}: {node} mounts nothing at {NATS_CONF_IN_CONTAINER}")


@contextmanager
def mongo_replica_set() -> Iterator[str]:
    """compose.yaml's ``mongo``: one mongod in replica set ``rs0``, initiated and PRIMARY.

    Yields a connection string for this host. It connects directly
    (``directConnection=true``): the set's member is ``mongo:27017``, the name
    compose.yaml's clients use, which only resolves inside a Docker network.
    Transactions and change streams work on it, as in production.
    """
    service = compose_service(MONGO_SERVICE)
    command: list[str] = service["command"]
    set_name = command[command.index("--replSet") + 1]
    member = f"{service['hostname']}:{MONGO_PORT}"
    container = (
        DockerContainer(service["image"], hostname=service["hostname"])
        .with_command(command)
        .with_exposed_ports(MONGO_PORT)
        .waiting_for(
            LogMessageWaitStrategy(
                re.compile("waiting for connections", re.I)
            ).with_startup_timeout(STARTUP_S)
        )
    )
    with container:
        host, port = container.get_container_host_ip(), container.get_exposed_port(MONGO_PORT)
        url = f"mongodb://{host}:{port}/?directConnection=true"
        _initiate(url, set_name, member)
        yield url


def _initiate(url: str, set_name: str, member: str) -> None:
    """What compose.yaml's healthcheck does: rs.initiate, then wait to be PRIMARY."""
    client: MongoClient[dict[str, Any]] = MongoClient(url, serverSelectionTimeoutMS=30_000)
    try:
        config = {"_id": set_name, "members": [{"_id": 0, "host": member}]}
        client.admin.command("replSetInitiate", config)
        deadline = time.monotonic() + STARTUP_S
        # Election takes a moment after initiate; writes fail until it is over.
        while not (hello := client.admin.command("hello")).get("isWritablePrimary"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"mongod never became PRIMARY of {set_name}: {hello}")
            time.sleep(0.2)
        if hello.get("setName") != set_name:
            raise RuntimeError(f"mongod is PRIMARY of {hello.get('setName')!r}, not {set_name}")
    finally:
        client.close()


@contextmanager
def nats_cluster() -> Iterator[list[str]]:
    """compose.yaml's three NATS nodes, routed to each other on one Docker network.

    Each node runs the official image with its production configuration file (cluster
    routes to ``nats-1..3:6222``, JetStream on); the network aliases are the names those
    routes use. Yields the three client URLs for this host, once every node's
    ``/healthz`` passes: JetStream has a meta leader, so replicated streams can be made.
    """
    image = compose_service(NATS_NODES[0])["image"]
    with Network() as network, ExitStack() as running:
        nodes: list[DockerContainer] = []
        for name in NATS_NODES:
            node = (
                DockerContainer(image, hostname=name)
                .with_command(compose_service(name)["command"])
                .with_network(network)
                .with_network_aliases(name)
                .with_exposed_ports(NATS_CLIENT_PORT, NATS_MONITOR_PORT)
                .with_copy_into_container(nats_conf(name), NATS_CONF_IN_CONTAINER)
                .waiting_for(
                    LogMessageWaitStrategy("Server is ready").with_startup_timeout(STARTUP_S)
                )
            )
            nodes.append(running.enter_context(node))
        # Not a per-node wait at start: /healthz needs a meta leader, i.e. a quorum of
        # routed nodes, so the first node could never pass it alone.
        for node in nodes:
            HttpWaitStrategy(NATS_MONITOR_PORT, "/healthz").with_startup_timeout(
                STARTUP_S
            ).wait_until_ready(node)
        yield [
            f"nats://{node.get_container_host_ip()}:{node.get_exposed_port(NATS_CLIENT_PORT)}"
            for node in nodes
        ]
