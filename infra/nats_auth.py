"""Per-role NATS users for one trialbus installation: permissions, files, connecting.

Every process talks to NATS as one of six roles, each a NATS user whose publish and
subscribe permissions name exactly the subjects its code sends to (the JetStream API
is reached by publishing requests to ``$JS.API.*`` subjects, so API rights are
publish rights too). Everything is derived from a :class:`~schemas.subjects.Topology`:

- ``admin`` owns the installation's streams, buckets and durable consumers: the only
  role that may create, update, delete or purge them (scoped to this installation's
  names, so two installations sharing a cluster cannot touch each other's).
- ``submitter`` publishes work and ExperimentSubmitted, follows events, sets cancel
  flags, uploads task archives and reads the runner registry.
- ``runner`` consumes work through the shared durable only, publishes its run events
  and live logs, uses the leases / attempt-counter / runner keys, reads tasks and
  writes results. No work, no experiment events, no cancel flags, no stream config.
- ``importer`` / ``watcher`` consume events through their own durable and publish
  ResultImported / ExperimentCompleted (+ the watcher's external announcements).
- ``subscriber`` (CI, dashboards) reads events and logs through ephemeral consumers.

Replies (JetStream acks, API answers, pulled messages) reach a client on its inbox.
Each role gets its own inbox prefix and may subscribe only there: with the default
``_INBOX.>`` any user could subscribe to every other client's replies, pulled work
messages included.

Authentication is user/password: random passwords, kept in files of mode 0600 (the
server config include and one credentials file per role), handed to nats-py as
connect arguments, never in URLs or on command lines. The server config holds them in
plain text (nats-server accepts bcrypt hashes too, but no bcrypt library is installed
here); it lives beside the credentials files with the same owner and mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from faststream.nats import NatsUserPassword
from nats.aio.client import Client as NatsClient

from schemas.subjects import Topology

ROLES = ("admin", "submitter", "runner", "importer", "watcher", "subscriber")
"""Every role, in the order they are written into the server config."""

AUTH_CONF = "auth.conf"
"""Name of the server config include written by :func:`write_auth`."""

API = "$JS.API"


class CredentialsError(RuntimeError):
    """A credentials file is missing, malformed or readable by others (names the fix)."""


@dataclass(frozen=True, slots=True)
class Permissions:
    """Subjects a role may publish to and subscribe to (allow lists; all else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RoleCredentials:
    """What a client of one role needs to connect. ``repr`` never shows the password."""

    role: str
    user: str
    password: str = field(repr=False)
    inbox_prefix: str

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        return {"user": self.user, "password": self.password, "inbox_prefix": self.inbox_prefix}

    def broker_options(self) -> dict[str, Any]:
        """Keyword arguments for FastStream's ``NatsBroker`` (it takes a ``security``)."""
        return {
            "security": NatsUserPassword(self.user, self.password),
            "inbox_prefix": self.inbox_prefix,
        }

    @property
    def subscription_inbox_prefix(self) -> bytes:
        """``inbox_prefix`` for FastStream's ``broker.subscriber(...)`` of a pull consumer.

        FastStream passes its own default (``_INBOX.``) to nats-py for pull
        subscriptions, overriding the connection's, which this role may not use.
        """
        return f"{self.inbox_prefix}.".encode()


def user_name(topology: Topology, role: str) -> str:
    """NATS user name of ``role`` (prefixed: installations may share a cluster)."""
    _check_role(role)
    return f"{topology.prefix}-{role}"


def inbox_prefix(topology: Topology, role: str) -> str:
    """The only inbox ``role`` may subscribe to (its replies arrive there)."""
    _check_role(role)
    return f"_INBOX.{topology.prefix}.{role}"


def kv_stream(bucket: str) -> str:
    """Backing stream of a KV bucket (NATS naming)."""
    return f"KV_{bucket}"


def obj_stream(bucket: str) -> str:
    """Backing stream of an object store bucket (NATS naming)."""
    return f"OBJ_{bucket}"


def all_streams(topology: Topology) -> tuple[str, ...]:
    """Every stream of the installation, buckets' backing streams included."""
    t = topology
    return (
        t.work_stream,
        t.events_stream,
        t.logs_stream,
        kv_stream(t.leases_bucket),
        kv_stream(t.control_bucket),
        kv_stream(t.runners_bucket),
        obj_stream(t.tasks_bucket),
        obj_stream(t.results_bucket),
    )


# -- building blocks: what one nats-py call sends -----------------------------------------
def _info(*streams: str) -> list[str]:
    # js.stream_info / key_value / object_store (ensure_streams opens all three streams).
    return [f"{API}.STREAM.INFO.{s}" for s in streams]


def _durable(stream: str, durable: str) -> list[str]:
    # consumer_info (before binding), fetch (MSG.NEXT), and ack/nak/term/in_progress,
    # which are publishes to the delivered message's reply subject $JS.ACK.<s>.<c>.<...>.
    return [
        f"{API}.CONSUMER.INFO.{stream}.{durable}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _follow(stream: str) -> list[str]:
    # js.subscribe(ordered_consumer=True): finds the stream by subject (STREAM.NAMES,
    # a list of names), then creates an ephemeral push consumer on the legacy subject
    # (no name in it), which the server refuses for a durable config; flow control
    # asks the client to answer on $JS.FC.<stream>.>.
    return [f"{API}.STREAM.NAMES", f"{API}.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>"]


def _kv_read(bucket: str) -> list[str]:
    # kv.get: a direct get ($JS.API.DIRECT.GET.KV_b.$KV.b.<key>) when the bucket allows
    # it, else STREAM.MSG.GET. kv.create also reads after a conflict.
    s = kv_stream(bucket)
    return [f"{API}.DIRECT.GET.{s}", f"{API}.DIRECT.GET.{s}.>", f"{API}.STREAM.MSG.GET.{s}"]


def _kv_write(bucket: str, keys: str = ">") -> list[str]:
    # kv.put / create / update / delete / purge all publish to $KV.<bucket>.<key>.
    return [f"$KV.{bucket}.{keys}"]


def _obj_read(bucket: str) -> list[str]:
    # object_store.get: the meta by STREAM.MSG.GET (last by subject), then the chunks
    # through an ordered consumer.
    s = obj_stream(bucket)
    return [f"{API}.STREAM.MSG.GET.{s}", *_follow(s)]


def _obj_write(bucket: str) -> list[str]:
    # object_store.put: looks for an existing object (STREAM.MSG.GET), publishes chunks
    # and meta to $O.<bucket>.>. Not granted: the STREAM.PURGE put sends when it
    # replaces an object or fails midway (a purge can empty the whole bucket).
    return [f"{API}.STREAM.MSG.GET.{obj_stream(bucket)}", f"$O.{bucket}.>"]


def _events(topology: Topology, *types: str) -> list[str]:
    return [f"{topology.prefix}.events.{t}.>" for t in types]


def role_permissions(topology: Topology, role: str) -> Permissions:
    """The exact allow lists of ``role`` for ``topology``."""
    _check_role(role)
    t = topology
    w, e, lg = t.work_stream, t.events_stream, t.logs_stream
    pub: list[str]
    if role == "admin":
        pub = [f"{API}.INFO", f"{API}.STREAM.NAMES", f"{API}.STREAM.LIST"]
        for s in all_streams(t):
            pub += [
                f"{API}.STREAM.*.{s}",  # CREATE UPDATE DELETE PURGE INFO ...
                f"{API}.STREAM.*.*.{s}",  # MSG.GET MSG.DELETE LEADER.STEPDOWN ...
                f"{API}.CONSUMER.*.{s}",  # legacy ephemeral CREATE, LIST, NAMES
                f"{API}.CONSUMER.*.{s}.>",  # CREATE (named) INFO DELETE ...
                f"{API}.CONSUMER.*.*.{s}.>",  # DURABLE.CREATE MSG.NEXT ...
                f"{API}.DIRECT.GET.{s}",
                f"{API}.DIRECT.GET.{s}.>",
                f"$JS.ACK.{s}.>",
                f"$JS.FC.{s}.>",
            ]
        for b in (t.leases_bucket, t.control_bucket, t.runners_bucket):
            pub += _kv_write(b)
        pub += [f"$O.{t.tasks_bucket}.>", f"$O.{t.results_bucket}.>", f"{t.prefix}.>"]
        sub = [f"{t.prefix}.>"]
    elif role == "submitter":
        pub = [
            t.work_wildcard,
            *_events(t, "experiment_submitted"),
            *_info(w, e, lg, kv_stream(t.leases_bucket), kv_stream(t.control_bucket)),
            *_info(kv_stream(t.runners_bucket), obj_stream(t.tasks_bucket)),
            *_follow(e),
            *_kv_write(t.control_bucket, "cancel.>"),
            *_kv_read(t.runners_bucket),
            *_obj_write(t.tasks_bucket),
        ]
        sub = []
    elif role == "runner":
        pub = [
            *_events(t, "trial_started", "trial_completed", "trial_failed"),
            t.logs_wildcard,
            *_info(w, e, lg, *(kv_stream(b) for b in _runner_kv(t))),
            *_info(obj_stream(t.tasks_bucket), obj_stream(t.results_bucket)),
            *_durable(w, t.runner_durable),
            *_kv_write(t.leases_bucket),
            *_kv_read(t.leases_bucket),
            *_kv_write(t.control_bucket, "runs.>"),
            *_kv_read(t.control_bucket),
            *_kv_write(t.runners_bucket),
            *_kv_read(t.runners_bucket),
            *_obj_read(t.tasks_bucket),
            *_obj_write(t.results_bucket),
        ]
        sub = []
    elif role == "importer":
        pub = [
            *_events(t, "result_imported"),
            *_info(w, e, lg, obj_stream(t.results_bucket)),
            *_durable(e, t.importer_durable),
            *_obj_read(t.results_bucket),
        ]
        sub = []
    elif role == "watcher":
        pub = [
            *_events(t, "experiment_completed", "experiment_submitted", "trial_completed"),
            *_info(w, e, lg),
            *_durable(e, t.watcher_durable),
        ]
        sub = []
    else:  # subscriber
        pub = [*_info(e, lg), *_follow(e), *_follow(lg)]
        sub = []
    sub.append(f"{inbox_prefix(t, role)}.>")
    return Permissions(tuple(dict.fromkeys(pub)), tuple(dict.fromkeys(sub)))


def _runner_kv(topology: Topology) -> tuple[str, ...]:
    return (topology.leases_bucket, topology.control_bucket, topology.runners_bucket)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown NATS role {role!r}; expected one of {', '.join(ROLES)}")


# -- files ----------------------------------------------------------------------------
def render_server_config(topology: Topology, credentials: Mapping[str, RoleCredentials]) -> str:
    """The ``authorization`` block (nats-server config syntax) for these credentials.

    No ``no_auth_user``: a client without credentials is refused.
    """

    def q(text: str) -> str:
        return json.dumps(text)  # a JSON string is a valid quoted nats-server string

    def subjects(items: Sequence[str]) -> str:
        return "[" + ", ".join(q(s) for s in items) + "]"

    lines = [
        f"# Generated by trialbus (infra/nats_auth.py) for prefix {topology.prefix!r}.",
        "# Holds every role's password: keep it mode 0600, regenerate rather than edit.",
        "authorization {",
        "  users = [",
    ]
    for role in ROLES:
        cred = credentials[role]
        perms = role_permissions(topology, role)
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


def include_directive(main_config: Path, server_config: Path) -> str:
    """The line that includes ``server_config`` from the nats-server config ``main_config``.

    nats-server resolves an include relative to the including file's folder (an
    absolute path is joined to it too), so the path is made relative.
    """
    rel = os.path.relpath(server_config.resolve(), main_config.resolve().parent)
    return f"include {json.dumps(rel)}\n"


def credentials_path(folder: Path, role: str) -> Path:
    """File of ``role``'s credentials inside an auth folder."""
    _check_role(role)
    return folder / f"{role}.json"


def write_auth(folder: Path, topology: Topology, *, rotate: bool = False) -> AuthFiles:
    """Write the server config include and one credentials file per role (all 0600).

    Existing credentials are kept (a second ``trialbus up`` must not lock out running
    services) unless ``rotate``; the server config is rewritten every time so it
    always carries this code's permissions.
    """
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    creds: dict[str, RoleCredentials] = {}
    paths: dict[str, Path] = {}
    for role in ROLES:
        path = credentials_path(folder, role)
        existing = None if rotate or not path.exists() else load_credentials(path)
        if existing is not None and existing.user != user_name(topology, role):
            existing = None  # another prefix: these are not this installation's
        cred = existing or RoleCredentials(
            role=role,
            user=user_name(topology, role),
            password=secrets.token_urlsafe(32),
            inbox_prefix=inbox_prefix(topology, role),
        )
        if existing is None:
            record = {k: getattr(cred, k) for k in ("role", "user", "password", "inbox_prefix")}
            _write_private(path, json.dumps(record, indent=2) + "\n")
        creds[role], paths[role] = cred, path
    server_config = folder / AUTH_CONF
    _write_private(server_config, render_server_config(topology, creds))
    return AuthFiles(folder, server_config, paths)


def load_credentials(path: Path) -> RoleCredentials:
    """Read a role's credentials file; refuses one that group or others can read."""
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
        cred = RoleCredentials(
            role=str(data["role"]),
            user=str(data["user"]),
            password=str(data["password"]),
            inbox_prefix=str(data["inbox_prefix"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CredentialsError(
            f"NATS credentials {path} are malformed ({type(exc).__name__}: missing or bad "
            "field); regenerate them (trialbus up rewrites a missing file)"
        ) from None  # the message must not quote the file: it holds the password
    _check_role(cred.role)
    return cred


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, created with mode 0600 (never wider)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
