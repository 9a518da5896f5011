"""Deployment commands of the ``trialbus`` CLI: certificates, compose's files, provisioning.

``certs`` and ``compose-config`` write files only (infra/tls.py,
infra/compose_config.py); ``provision`` is compose's init step: as the admin role it
creates every stream, bucket and durable before the services start (they may only
look). docs/operations.md shows them in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from services.common import errors as E

Runner = Callable[[Callable[[], Awaitable[None]]], None]
# Module level: the annotations below are evaluated here (``from __future__``).
HostsOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated names/IPs the NATS servers are reached by "
        "(default: nats-1,nats-2,nats-3,localhost,127.0.0.1)."
    ),
]


def _hosts(text: str | None) -> list[str]:
    from infra.tls import DEFAULT_HOSTS  # here: cryptography is not every command's import

    return (
        list(DEFAULT_HOSTS) if text is None else [h.strip() for h in text.split(",") if h.strip()]
    )


def register(app: typer.Typer, run: Runner, err: Console) -> None:
    """Add the deployment commands to the CLI's ``app``; ``run`` maps errors to exit codes."""

    @app.command()
    def certs(
        folder: Annotated[Path, typer.Argument(help="Where the CA and certificate go (0700).")],
        hosts: HostsOpt = None,
        rotate: Annotated[bool, typer.Option(help="Make a new CA too (clients need it).")] = False,
    ) -> None:
        """Make a private CA (kept if present) and the NATS servers' certificate."""
        from infra.tls import TlsError, write_certs

        try:
            files = write_certs(folder, _hosts(hosts), rotate=rotate)
        except TlsError as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(E.EXIT_USER_ERROR) from None
        print(f"CA (give to clients): {files.ca_cert}")
        print(f"server certificate:   {files.server_cert} (key {files.server_key}, 0600)")

    @app.command(name="compose-config")
    def compose_config(
        folder: Annotated[Path, typer.Argument(help="compose.yaml's secrets folder.")] = Path(
            ".trialbus/compose"
        ),
        hosts: HostsOpt = None,
        rotate: Annotated[bool, typer.Option(help="New passwords, keyfile and CA.")] = False,
        prefix: Annotated[str, typer.Option(help="Stream/subject namespace.")] = "trialbus",
    ) -> None:
        """Write every file compose.yaml mounts: TLS, NATS configs and users, MongoDB secrets.

        Kept across runs (a running deployment keeps working) unless --rotate.
        """
        import os

        from infra.compose_config import SERVICE_UID, write_compose_config
        from infra.tls import TlsError
        from schemas.subjects import Topology
        from services.common.settings import CommonSettings

        try:
            files = write_compose_config(
                folder,
                Topology(prefix),
                hosts=_hosts(hosts),
                rotate=rotate,
                # The runner users may fetch each class this installation has.
                classes=CommonSettings().classes,
            )
        except TlsError as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(E.EXIT_USER_ERROR) from None
        print(f"wrote {files.folder} (NATS TLS, users and routes; MongoDB secrets; ledger.env)")
        if os.geteuid() != 0 and os.getuid() != SERVICE_UID:
            err.print(
                f"note: the trialbus containers run as uid {SERVICE_UID} and must read their "
                f"credentials: run `sudo chown -R {SERVICE_UID} {files.auth.folder}` (or run "
                "this command with sudo), and the same for the API tokens file"
            )

    @app.command()
    def provision(
        pool: Annotated[
            list[str] | None, typer.Option(help="Runner pools to give a durable (repeat).")
        ] = None,
    ) -> None:
        """Create the streams, buckets and durables, as the admin role (compose's init step).

        Reads the usual settings: NATS_URL, TRIALBUS_NATS_CREDENTIALS (the admin's file),
        TRIALBUS_STREAM_REPLICAS, TRIALBUS_ACK_WAIT_S (the runners').
        """
        from infra.nats_auth import CredentialsError
        from infra.nats_provision import provision as provision_all
        from schemas.subjects import DEFAULT_POOL
        from services.common.adapters.jetstream import connect
        from services.common.errors import UserInputError
        from services.common.settings import RunnerSettings

        settings = RunnerSettings()

        async def go() -> None:
            try:
                nc = await connect(
                    settings.nats_servers,
                    "trialbus-provision",
                    credentials=settings.nats_credentials,
                    role="admin" if settings.nats_credentials else None,
                )
            except CredentialsError as exc:  # missing, another role's, or not 0600
                raise UserInputError(str(exc)) from None
            try:
                await provision_all(
                    nc.jetstream(),
                    settings.topology,
                    lease_ttl_s=settings.ack_wait_s,
                    runner_ack_wait_s=settings.ack_wait_s,
                    replicas=settings.stream_replicas,
                    pools=pool or [DEFAULT_POOL],
                    classes=settings.classes,
                )
            finally:
                await nc.close()
            print(f"provisioned {settings.topology.prefix} ({settings.stream_replicas} replicas)")

        run(go)
