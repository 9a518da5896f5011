"""The compose deployment's NATS, run as a real 3-node cluster on loopback.

infra/compose_config.py generates every file (CA and certificate for 127.0.0.1, the
per-role users, the route password); each node's config is rendered by the same
function as compose's nats-<i>.conf, with host paths and loopback ports in place of
the container's. Proven: a role with the CA and its credentials works over TLS through
R3 streams (``trialbus provision`` as the admin, as compose's init step runs it;
nats-py as the runner and submitter connect, FastStream as the importer and watcher
do); refused: a plaintext client, a client
without credentials, a client that does not trust the CA, and a fourth server that
holds a certificate of the CA but not the route password.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from faststream.nats import NatsBroker
from nats.errors import Error as NatsError

from infra.compose_config import (
    ComposeFiles,
    NodeTls,
    RouteAuth,
    read_route_auth,
    render_node_config,
    write_compose_config,
)
from infra.embedded import NatsServer, free_port
from infra.managed_process import LOOPBACK
from infra.nats_auth import connect_as, load_credentials
from infra.tls import write_certs
from schemas.subjects import Topology
from services.common.adapters.jetstream import connect
from tests.support.bus_roles import require_nats_server

pytestmark = pytest.mark.integration

TOPO = Topology("trialbus")
WAIT_S = 30.0


@dataclass(slots=True)
class Cluster:
    files: ComposeFiles
    nodes: list[NatsServer]
    route_ports: list[int]

    @property
    def tls_urls(self) -> list[str]:
        return [f"tls://{LOOPBACK}:{n.port}" for n in self.nodes]


def _node(
    data: Path,
    name: str,
    route_port: int,
    peers: list[int],
    files: ComposeFiles,
    route_auth: RouteAuth,
    tls: NodeTls,
) -> NatsServer:
    data.mkdir(parents=True)
    config = render_node_config(
        name,
        routes=[f"{LOOPBACK}:{p}" for p in peers],
        cluster_listen=f"{LOOPBACK}:{route_port}",
        advertise=f"{LOOPBACK}:{route_port}",
        tls=tls,
        auth_include=os.path.relpath(files.folder / "nats" / "auth.conf", data),
        route_auth=route_auth,
        store_dir=None,  # NatsServer passes -sd
    )
    return NatsServer(data, server_name=name, config=config)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_nats_server()
    root = tmp_path_factory.mktemp("compose-tls")
    files = write_compose_config(root / "compose", TOPO, hosts=[LOOPBACK, "localhost"])
    route_auth = read_route_auth(files.folder / "nats" / "route.json")
    ports = [free_port() for _ in range(3)]
    tls = NodeTls.in_folder(files.tls.folder)
    nodes = [
        _node(root / f"n{i}", f"n{i}", ports[i], ports, files, route_auth, tls) for i in range(3)
    ]
    try:
        for node in nodes:
            node.start()
        _wait(lambda: all(n.healthz("") for n in nodes), "the cluster to be healthy")
        _provision(files, [f"tls://{LOOPBACK}:{n.port}" for n in nodes])
        yield Cluster(files, nodes, ports)
    finally:
        for node in nodes:
            node.stop()


def _provision(files: ComposeFiles, urls: list[str]) -> None:
    """compose's init step, as compose runs it: ``trialbus provision`` as the admin, R3."""
    env = {
        **os.environ,
        "NATS_URL": ",".join(urls),
        "TRIALBUS_NATS_CREDENTIALS": str(files.auth.credentials["admin"]),
        "TRIALBUS_STREAM_REPLICAS": "3",
        "TRIALBUS_ACK_WAIT_S": "30",
    }
    cmd = [sys.executable, "-c", "from services.cli import main; main()", "provision"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "provisioned trialbus (3 replicas)" in done.stdout


def _wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)  # polling interval


def _route_names(node: NatsServer) -> set[str]:
    """Server names of the routes ``node`` has right now (its /routez)."""
    with urllib.request.urlopen(f"{node.monitor_url}/routez", timeout=2) as resp:
        routes: list[dict[str, Any]] = json.load(resp).get("routes") or []
    return {str(r.get("remote_name", "")) for r in routes}


async def test_roles_work_over_tls_through_replicated_streams(cluster: Cluster) -> None:
    files = cluster.files
    exp = f"e-{uuid.uuid4().hex[:8]}"
    # As the runner and the submitter connect: the adapter's connect with a file.
    submitter = await connect(
        cluster.tls_urls, "submitter", credentials=files.auth.credentials["submitter"]
    )
    runner = await connect(
        cluster.tls_urls, "runner", credentials=files.auth.credentials["runner"], role="runner"
    )
    try:
        assert submitter.connected_url is not None
        assert submitter.connected_url.scheme == "tls"
        info = await runner.jetstream().stream_info(TOPO.work_stream)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        ack = await submitter.jetstream().publish(TOPO.work_subject(exp), b'{"w": 1}')
        assert ack.stream == TOPO.work_stream
        psub = await runner.jetstream().pull_subscribe_bind(
            TOPO.runner_durable, stream=TOPO.work_stream
        )
        seen: list[str] = []
        while TOPO.work_subject(exp) not in seen:
            for msg in await psub.fetch(batch=10, timeout=5):
                seen.append(msg.subject)
                await msg.ack_sync()
    finally:
        await submitter.close()
        await runner.close()
    # As the importer and watcher connect: FastStream with the role's options.
    cred = load_credentials(files.auth.credentials["watcher"], "watcher")
    broker = NatsBroker(cluster.tls_urls, logger=None, **cred.broker_options())
    try:
        await broker.connect()
        subject = TOPO.event_subject("experiment_completed", exp)
        ack = await broker.connection.jetstream().publish(subject, b"{}")
        assert ack.stream == TOPO.events_stream
    finally:
        await broker.stop()


async def test_plaintext_anonymous_and_untrusting_clients_are_refused(cluster: Cluster) -> None:
    files = cluster.files
    cred = load_credentials(files.auth.credentials["subscriber"], "subscriber")
    host_port = f"{LOOPBACK}:{cluster.nodes[0].port}"
    once = {"allow_reconnect": False, "max_reconnect_attempts": 0, "connect_timeout": 3}
    # Plaintext: nats-py upgrades by itself when the server asks, so a raw client that
    # ignores the request and sends its CONNECT in clear stands for a plaintext one.
    reader, writer = await asyncio.open_connection(LOOPBACK, cluster.nodes[0].port)
    info = json.loads((await reader.readline()).decode().removeprefix("INFO "))
    assert info.get("tls_required") is True
    writer.write(b'CONNECT {"verbose":false,"user":"x","pass":"y"}\r\nPING\r\n')
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), timeout=WAIT_S)
    # The server reads the clear bytes as a failed TLS handshake and hangs up: no PONG.
    assert b"PONG" not in answer, answer
    assert await asyncio.wait_for(reader.read(4096), timeout=WAIT_S) == b""  # closed
    writer.close()
    # TLS trusting the CA, without credentials.
    with pytest.raises(NatsError) as anon:
        await nats.connect(f"tls://{host_port}", tls=cred.tls_context(), **once)
    assert "authorization violation" in str(anon.value).lower(), anon.value
    # Valid credentials, but trusting another CA (a server impersonator would look so).
    other = write_certs(files.folder.parent / "other-ca", [LOOPBACK])
    untrusting = ssl.create_default_context(cafile=str(other.ca_cert))
    with pytest.raises((ssl.SSLError, NatsError, OSError)) as bad:
        await nats.connect(
            f"tls://{host_port}", tls=untrusting, user=cred.user, password=cred.password, **once
        )
    assert "certificate" in repr(bad.value).lower() or isinstance(bad.value, ssl.SSLError)
    # Negative control: the same credentials and the right CA connect.
    nc = await connect_as([f"tls://{host_port}"], cred, name="control", **once)
    assert nc.is_connected
    await nc.close()


def test_a_server_without_the_route_password_cannot_join(cluster: Cluster, tmp_path: Path) -> None:
    """The intruder holds a certificate of the CA: TLS alone would let it in."""
    files = cluster.files
    name = "intruder"
    good = read_route_auth(files.folder / "nats" / "route.json")
    wrong = RouteAuth(good.user, "not-the-route-password")
    intruder = _node(
        tmp_path / name,
        name,
        free_port(),
        cluster.route_ports,
        files,
        wrong,
        NodeTls.in_folder(files.tls.folder),
    )
    # Negative control: the same setup with the right password joins.
    member = _node(
        tmp_path / "member", "member", free_port(), cluster.route_ports, files, good,
        NodeTls.in_folder(files.tls.folder),
    )  # fmt: skip
    target = cluster.nodes[0]
    with member, intruder:
        _wait(lambda: "member" in _route_names(target), "the member's route on n0")
        # The intruder dialled every node (connect_retries) while the member joined.
        assert "intruder" not in _route_names(target)
        log = (intruder.data_dir / intruder.log_name).read_text(errors="replace").lower()
        assert "authorization violation" in log or "authentication" in log, log[-2000:]
