"""Per-role NATS users for one trialbus installation: files and connecting.

Every process talks to NATS as one of six roles (infra.nats_permissions says what each
may do). ``write_auth`` writes, into one folder of mode 0700, the nats-server config
include (an ``authorization`` block with one user per role and its allow lists) and
one credentials file per role, all mode 0600; ``load_credentials`` reads a role's file
and ``connect_as`` connects with it.

Authentication is user/password: random 256-bit passwords, handed to nats-py as
connect arguments, never in URLs or on command lines. A credentials file may also name
the CA that signed the servers' certificate (``ca_file``, relative to the file's
folder): its clients then connect over TLS and trust that CA only, like a NATS
context bundles credentials and CA. The compose generator (infra/compose_config.py)
writes such files; ``trialbus up`` (loopback) writes none. The server config holds them in
plain text (nats-server also accepts bcrypt hashes, but no bcrypt library is installed
here); it lives beside the credentials files with the same owner and mode, so it
exposes nothing those files do not.
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js.api import INBOX_PREFIX

from infra.nats_permissions import (
    ROLES,
    check_role,
    inbox_prefix,
    principal,
    role_permissions,
    user_name,
)
from schemas.subjects import DEFAULT_POOL, Topology
from services.common.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses
from services.common.private_files import write_private

AUTH_CONF = "auth.conf"
"""Name of the server config include written by :func:`write_auth`."""


class CredentialsError(RuntimeError):
    """A credentials file is missing, malformed or readable by others (names the fix)."""


@dataclass(frozen=True, slots=True)
class RoleCredentials:
    """What a client of one role needs to connect. ``repr`` never shows the password."""

    role: str
    user: str
    password: str = field(repr=False)
    inbox_prefix: str
    ca_file: Path | None = None
    """The CA the servers' certificate must chain to; None: no TLS of its own."""

    def tls_context(self) -> ssl.SSLContext | None:
        """A client TLS context trusting ``ca_file`` only (hostnames checked), or None."""
        if self.ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.ca_file))

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        options: dict[str, Any] = {
            "user": self.user,
            "password": self.password,
            "inbox_prefix": self.inbox_prefix,
        }
        tls = self.tls_context()
        if tls is not None:
            options["tls"] = tls
        return options

    def broker_options(self) -> dict[str, Any]:
        """Keyword arguments for FastStream's ``NatsBroker`` (it takes a ``security``)."""
        # Imported here: the CLI and the runner use this module without FastStream, whose
        # import installs its own log handler (services.common.logging takes it off).
        from faststream.nats import NatsUserPassword

        return {
            "security": NatsUserPassword(self.user, self.password, ssl_context=self.tls_context()),
            "inbox_prefix": self.inbox_prefix,
        }

    @property
    def subscription_inbox_prefix(self) -> bytes:
        """``inbox_prefix`` for FastStream's ``broker.subscriber(...)`` of a pull consumer.

        FastStream passes its own default (``_INBOX.``) to nats-py for pull
        subscriptions, overriding the connection's, which this role may not use.
        """
        return f"{self.inbox_prefix}.".encode()


# -- files ----------------------------------------------------------------------------
def render_server_config(
    topology: Topology,
    credentials: Mapping[str, RoleCredentials],
    js_domain: str | None = None,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> str:
    """The ``authorization`` block (nats-server config syntax) for these credentials.

    ``js_domain``: the server's JetStream domain, when clients reach it through leaf
    nodes (infra.nats_permissions.role_permissions says why).

    No ``no_auth_user``: a client without credentials is refused.
    """

    def q(text: str) -> str:
        return json.dumps(text)  # a JSON string is a valid quoted nats-server string

    def subjects(items: Sequence[str]) -> str:
        return "[" + ", ".join(q(s) for s in items) + "]"

    def pool_of(name: str, role: str) -> str:
        # Keys are principals: "runner" (the default pool) or "runner-<pool>".
        return name.removeprefix(f"{role}-") if name != role else DEFAULT_POOL

    lines = [
        f"# Generated by trialbus (infra/nats_auth.py) for prefix {topology.prefix!r}.",
        "# Holds every role's password: keep it mode 0600, regenerate rather than edit.",
        "authorization {",
        "  users = [",
    ]
    for name, cred in credentials.items():
        perms = role_permissions(topology, cred.role, pool_of(name, cred.role), js_domain, classes)
        lines += [
            f"    {{user: {q(cred.user)}, password: {q(cred.password)}, permissions: {{",
            f"      publish: {{allow: {subjects(perms.publish)}}}",
            f"      subscribe: {{allow: {subjects(perms.subscribe)}}}",
            "    }}",
        ]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class AuthFiles:
    """Where :func:`write_auth` put the server include and each role's credentials."""

    folder: Path
    server_config: Path
    credentials: dict[str, Path]
    """Keyed by principal: each role, plus ``runner-<pool>`` for each extra pool."""


def include_directive(main_config: Path, server_config: Path) -> str:
    """The line that includes ``server_config`` from the nats-server config ``main_config``.

    nats-server resolves an include relative to the including file's folder (an
    absolute path is joined to it too), so the path is made relative.
    """
    rel = os.path.relpath(server_config.resolve(), main_config.resolve().parent)
    return f"include {json.dumps(rel)}\n"


def credentials_path(folder: Path, role: str) -> Path:
    """File of ``role``'s credentials inside an auth folder."""
    check_role(role)
    return folder / f"{role}.json"


def write_auth(
    folder: Path,
    topology: Topology,
    *,
    rotate: bool = False,
    pools: Sequence[str] = (),
    js_domain: str | None = None,
    ca_file: str | None = None,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> AuthFiles:
    """Write the server config include and one credentials file per role (all 0600).

    ``pools`` adds a runner user per named pool (``runner-<pool>.json``), allowed that
    pool's work only; the plain ``runner`` user is the default pool's. ``js_domain``
    is the server's JetStream domain when runners reach it through leaf nodes;
    ``classes`` the installation's priority classes (a runner may fetch through its
    pool's durable of each; default: services.common.priority's defaults).
    ``ca_file`` (relative to ``folder``, or absolute) goes into every credentials
    file: their clients then require TLS with a server certificate that CA signed.

    Existing credentials are kept (a second ``trialbus up`` must not lock out running
    services) unless ``rotate``; the server config is rewritten every time so it
    always carries this code's permissions.
    """
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    creds: dict[str, RoleCredentials] = {}
    paths: dict[str, Path] = {}
    principals = [(r, DEFAULT_POOL) for r in ROLES]
    principals += [("runner", p) for p in dict.fromkeys(pools) if p != DEFAULT_POOL]
    for role, pool in principals:
        name = principal(role, pool)
        path = folder / f"{name}.json"
        existing = None if rotate or not path.exists() else load_credentials(path)
        user = user_name(topology, role, pool)
        # Only the password is kept: the rest follows this code and the topology (a
        # file from another prefix is not this installation's and is replaced).
        keep = existing is not None and existing.user == user
        cred = RoleCredentials(
            role=role,
            user=user,
            password=existing.password if existing is not None and keep else _new_password(),
            inbox_prefix=inbox_prefix(topology, role, pool),
            ca_file=None if ca_file is None else folder / ca_file,
        )
        if cred != existing:
            record = {k: getattr(cred, k) for k in ("role", "user", "password", "inbox_prefix")}
            if ca_file is not None:
                record["ca_file"] = ca_file  # as given: the folder may be mounted elsewhere
            write_private(path, json.dumps(record, indent=2) + "\n")
        creds[name], paths[name] = cred, path
    server_config = folder / AUTH_CONF
    write_private(server_config, render_server_config(topology, creds, js_domain, classes))
    return AuthFiles(folder, server_config, paths)


def _new_password() -> str:
    return secrets.token_urlsafe(32)  # 256 random bits, in [A-Za-z0-9_-]


def load_credentials(path: Path, role: str | None = None) -> RoleCredentials:
    """Read a role's credentials file; refuses one that group or others can read.

    With ``role``, also refuses another role's file (a service handed the wrong one).
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CredentialsError(f"cannot read NATS credentials {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(
            f"NATS credentials {path} are accessible to other users (mode "
            f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}`"
        )
    try:
        data = json.loads(text)
        ca = data.get("ca_file")
        cred = RoleCredentials(
            role=str(data["role"]),
            user=str(data["user"]),
            password=str(data["password"]),
            inbox_prefix=str(data["inbox_prefix"]),
            ca_file=None if ca is None else path.parent / str(ca),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CredentialsError(
            f"NATS credentials {path} are malformed ({type(exc).__name__}: missing or bad "
            "field); regenerate them (trialbus up rewrites a missing file)"
        ) from None  # the message must not quote the file: it holds the password
    if cred.role not in ROLES or (role is not None and cred.role != role):
        raise CredentialsError(
            f"NATS credentials {path} are for role {cred.role!r}, expected "
            f"{role or 'one of ' + ', '.join(ROLES)!r}"
        )
    if cred.ca_file is not None and not cred.ca_file.is_file():
        raise CredentialsError(
            f"NATS credentials {path} name the CA file {cred.ca_file}, which is missing; "
            "mount or copy the CA's ca.pem there (`trialbus certs` makes it)"
        )
    return cred


# -- connecting -----------------------------------------------------------------------
async def connect_as(
    servers: Sequence[str], credentials: RoleCredentials, *, name: str, **options: Any
) -> NatsClient:
    """Connect to NATS as ``credentials``' role (password as an argument, not in a URL).

    ``options`` go to ``nats.connect`` (reconnect policy, error callback, ...); the
    URLs must carry no user info, so nothing secret reaches a log line that prints them.
    """
    for url in servers:
        if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
            raise CredentialsError(
                "a NATS URL carries user info; give credentials through the role's "
                "credentials file, not in the URL"
            )
    return await nats.connect(
        servers=list(servers), name=name, **credentials.connect_options(), **options
    )


@dataclass(frozen=True, slots=True)
class BrokerAuth:
    """FastStream options of one process: for its ``NatsBroker`` and its subscribers."""

    broker_options: dict[str, Any]
    subscription_inbox_prefix: bytes


def broker_auth(credentials: Path | None, role: str) -> BrokerAuth:
    """FastStream options for ``role``'s credentials file; anonymous ones when None.

    Refuses (CredentialsError) a file that is another role's or readable by others,
    so a service handed the wrong file stops at start with the fix in the message.
    """
    if credentials is None:
        return BrokerAuth({}, INBOX_PREFIX)  # FastStream's own default
    cred = load_credentials(credentials, role)
    return BrokerAuth(cred.broker_options(), cred.subscription_inbox_prefix)
