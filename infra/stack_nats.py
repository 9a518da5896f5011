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
from services.common.priority import (
    DEFAULT_CLASS,
    DEFAULT_CLASSES,
    DEFAULT_PRIORITY_CLASSES,
    PriorityClasses,
)
from services.common.settings import RunnerSettings

__all__ = [
    "connect_stack",
    "credentials_env",
    "runner_ack_wait_s",
    "stack_classes",
    "start_authenticated_nats",
]


def runner_ack_wait_s(env: Mapping[str, str]) -> float:
    """The runners' ack_wait from their environment (their durable's, the leases' TTL)."""
    default: float = RunnerSettings.model_fields["ack_wait_s"].default
    return float(env.get("TRIALBUS_ACK_WAIT_S", default))


def stack_classes(env: Mapping[str, str]) -> PriorityClasses:
    """The stack's priority classes from its processes' environment (names make the
    runner durables and the runners' fetch rights; services.common.priority)."""
    return PriorityClasses.parse(
        env.get("TRIALBUS_PRIORITY_CLASSES", DEFAULT_CLASSES),
        env.get("TRIALBUS_DEFAULT_PRIORITY_CLASS", DEFAULT_CLASS),
    )


def start_authenticated_nats(
    nats_dir: Path,
    auth_dir: Path,
    topology: Topology,
    *,
    port: int | None,
    ack_wait_s: float,
    host: str = LOOPBACK,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> tuple[NatsServer, AuthFiles]:
    """nats-server in ``nats_dir`` with the users written to ``auth_dir``, provisioned.

    ``ack_wait_s`` is the runners' (see :func:`runner_ack_wait_s`); ``host`` is the
    address it listens on (another than loopback when runners join from other
    machines or network namespaces); ``classes`` the stack's priority classes (see
    :func:`stack_classes`; default: the default classes). Raises the server's start-up error, or the
    admin's connection or JetStream error.
    """
    auth = write_auth(auth_dir, topology, classes=classes)
    # The include is the NatsServer's whole config, written again on every (re)start:
    # a supervised restart comes back with the same users.
    config = include_directive(nats_dir / "nats-server.conf", auth.server_config)
    server = NatsServer(nats_dir, port=port, config=config, host=host).start()
    with server.stopped_on_failure():
        asyncio.run(_provision(server.url, auth, topology, ack_wait_s, classes))
    return server, auth


async def _provision(
    url: str,
    auth: AuthFiles,
    topology: Topology,
    ack_wait_s: float,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> None:
    nc = await connect_stack(url, auth)
    try:
        await provision(
            nc.jetstream(),
            topology,
            lease_ttl_s=ack_wait_s,
            runner_ack_wait_s=ack_wait_s,
            classes=classes,
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
