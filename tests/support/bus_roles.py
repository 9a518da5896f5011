"""A private nats-server for the bus tests, anonymous or with the generated role users.

The session nats-server (tests/conftest.py) is anonymous and shared; the tests that
check what each role may do, or that need a server of their own, start one here:
``write_auth``'s users included from the server's config, the streams, buckets and
per-pool durables provisioned by the admin role as ``trialbus provision`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient

from infra.embedded import BinaryNotFoundError, NatsServer, find_binary
from infra.nats_auth import (
    AuthFiles,
    RoleCredentials,
    connect_as,
    include_directive,
    load_credentials,
    write_auth,
)
from infra.nats_provision import provision
from schemas.subjects import DEFAULT_POOL, Topology
from tests.conftest import skip_unless


def require_nats_server() -> None:
    """Skip the test (a failure under CI=true) when the nats-server binary is absent.

    Only a truly absent executable may skip; any other start-up failure must fail.
    """
    try:
        find_binary(NatsServer.binary_name, NatsServer.package)
    except BinaryNotFoundError as exc:
        skip_unless(str(exc))


@dataclass(slots=True)
class RoleBus:
    """A running nats-server with role users, and the files :func:`role_server` wrote."""

    server: NatsServer
    files: AuthFiles
    root: Path
    """Holds the server's data (``nats``) and the auth files (``auth``); free for more."""

    @property
    def url(self) -> str:
        """The server's client URL."""
        return self.server.url

    def credentials(self, principal: str) -> RoleCredentials:
        """``principal``'s credentials, checked to be that role's file.

        A pool's runner (``runner-remote``) is a runner: its file names the runner role.
        """
        return load_credentials(self.files.credentials[principal], principal.split("-")[0])

    async def connect(self, principal: str, *, name: str, **options: Any) -> NatsClient:
        """A connection to the server as ``principal`` (``options`` go to ``nats.connect``)."""
        return await connect_as([self.url], self.credentials(principal), name=name, **options)


@contextmanager
def role_server(
    root: Path,
    topo: Topology,
    *,
    pools: Sequence[str],
    ack_wait_s: float,
    js_domain: str | None = None,
    **server_options: Any,
) -> Iterator[RoleBus]:
    """A nats-server in ``root/nats`` with the role users of ``topo`` (and runner users
    for ``pools``) written to ``root/auth``, provisioned by the admin role for the
    default pool and ``pools``; stopped on exit. ``server_options`` go to ``NatsServer``."""
    files = write_auth(root / "auth", topo, pools=pools, js_domain=js_domain)
    data = root / "nats"
    data.mkdir()
    config = include_directive(data / "nats-server.conf", files.server_config)
    if js_domain is not None:
        config += f"jetstream {{ domain: {js_domain} }}\n"
    with NatsServer(data, config=config, **server_options) as server:
        bus = RoleBus(server, files, root)
        asyncio.run(_provision(bus, topo, (DEFAULT_POOL, *pools), ack_wait_s))
        yield bus


async def _provision(bus: RoleBus, topo: Topology, pools: Sequence[str], ack_wait_s: float) -> None:
    nc = await bus.connect("admin", name="admin")
    try:
        await provision(
            nc.jetstream(),
            topo,
            lease_ttl_s=ack_wait_s,
            runner_ack_wait_s=ack_wait_s,
            pools=tuple(pools),
        )
    finally:
        await nc.close()
