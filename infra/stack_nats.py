"""The embedded stack's own nats-server, run with a NATS user per role.

``start_authenticated_nats`` writes the users (infra.nats_auth) into the stack's data
folder, starts nats-server with them and creates everything in JetStream as the admin
role (infra.nats_provision) before any service starts; the services, which may not
create or redefine those objects, then only find them. ``connect_stack`` is the stack's
own connection for its readiness checks. A stack given an existing server (tests share
one without users) uses none of this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient

from infra.embedded import NatsServer
from infra.managed_process import LOOPBACK
from infra.nats_auth import AuthFiles, connect_as, include_directive, load_credentials, write_auth
from infra.nats_provision import provision
from schemas.subjects import Topology
from services.common.settings import RunnerSettings

__all__ = ["connect_stack", "credentials_env", "runner_ack_wait_s", "start_authenticated_nats"]


def runner_ack_wait_s(env: Mapping[str, str]) -> float:
    """The runners' ack_wait from their environment (their durable's, the leases' TTL)."""
    default: float = RunnerSettings.model_fields["ack_wait_s"].default
    return float(env.get("TRIALBUS_ACK_WAIT_S", default))


def start_authenticated_nats(
    nats_dir: Path,
    auth_dir: Path,
    topology: Topology,
    *,
    port: int | None,
    ack_wait_s: float,
    host: str = LOOPBACK,
) -> tuple[NatsServer, AuthFiles]:
    """nats-server in ``nats_dir`` with the users written to ``auth_dir``, provisioned.

    ``ack_wait_s`` is the runners' (see :func:`runner_ack_wait_s`); ``host`` is the
    address it listens on (another than loopback when runners join from other
    machines or network namespaces). Raises the server's start-up error, or the
    admin's connection or JetStream error.
    """
    auth = write_auth(auth_dir, topology)
    # The include is the NatsServer's whole config, written again on every (re)start:
    # a supervised restart comes back with the same users.
    config = include_directive(nats_dir / "nats-server.conf", auth.server_config)
    server = NatsServer(nats_dir, port=port, config=config, host=host).start()
    try:
        asyncio.run(_provision(server.url, auth, topology, ack_wait_s))
    except BaseException:
        server.stop()
        raise
    return server, auth


async def _provision(url: str, auth: AuthFiles, topology: Topology, ack_wait_s: float) -> None:
    nc = await connect_stack(url, auth)
    try:
        await provision(
            nc.jetstream(), topology, lease_ttl_s=ack_wait_s, runner_ack_wait_s=ack_wait_s
        )
    finally:
        await nc.close()


async def connect_stack(url: str, auth: AuthFiles | None) -> NatsClient:
    """The stack's own connection: as admin when NATS has users, else anonymous."""
    servers = url.split(",")
    if auth is None:
        return await nats.connect(servers=servers)
    admin = load_credentials(auth.credentials["admin"], "admin")
    return await connect_as(servers, admin, name="trialbus-stack")


def credentials_env(auth: AuthFiles | None, role: str) -> dict[str, str]:
    """The environment handing a service ``role``'s credentials (nothing without users)."""
    if auth is None:
        return {}
    return {"TRIALBUS_NATS_CREDENTIALS": str(auth.credentials[role])}
