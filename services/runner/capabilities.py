"""What this runner host can run, found by trying, not declared on faith.

A runner publishes its capabilities in the runner registry
(services.common.adapters.nats_registry); the submitter refuses a manifest whose
``compute.requires`` no live runner of its pool offers (services.common.pools).

- ``local``: bubblewrap creates a sandbox here (``bwrap --ro-bind / / --unshare-all
  true``: the namespaces trialbus's local environment needs).
- ``local.allowlist``: ``local``, and the runner runs as root: the local environment
  enforces a task's network allowlist with a proxy inside the sandbox's network
  namespace, which only root can enter (services/localenv/egress.py). The submitter
  marks the trials of a task that asks for one (``TrialRequested.task_requires``).
- ``docker``: the Docker daemon answers the Engine API's ``GET /_ping`` with ``OK``
  (what the ``docker`` SDK's ``ping()`` sends), AND Harbor's docker environment is
  importable and its own preflight command (``docker info``, via the CLI it drives)
  succeeds. The ping is spoken directly over the daemon's socket with the standard
  library: the ``docker`` SDK is not a dependency of trialbus and would be added for
  this one request only.

Operator labels (e.g. ``gpu``, from the runner's settings) are appended as given,
after validation: a label is a promise the operator makes, detection cannot check it.
"""

from __future__ import annotations

import http.client
import importlib
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from schemas.manifest import LOCAL_ALLOWLIST, LOCAL_ENVIRONMENT_ALIAS
from schemas.runners import check_capability
from services.common.logging import get_logger
from services.localenv import egress

log = get_logger(__name__)

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
PROBE_TIMEOUT_S = 10.0
"""Bound on each probe (a sandbox start, ``docker info``); the ping gets a fifth of it."""

HARBOR_DOCKER_MODULE = "harbor.environments.docker.docker"


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a UNIX socket (the Docker daemon's usual endpoint)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def docker_ping(docker_host: str = DEFAULT_DOCKER_HOST, timeout_s: float = 2.0) -> bool:
    """True when the daemon at ``docker_host`` answers ``GET /_ping`` with 200 ``OK``.

    ``docker_host`` is a ``DOCKER_HOST`` value: ``unix:///path`` or ``tcp://host:port``
    (plain HTTP; a TLS daemon is reported absent rather than guessed at).
    """
    url = urlsplit(docker_host)
    conn: http.client.HTTPConnection
    if url.scheme == "unix":
        conn = _UnixHTTPConnection(url.path, timeout_s)
    elif url.scheme in ("tcp", "http") and url.hostname:
        conn = http.client.HTTPConnection(url.hostname, url.port or 2375, timeout=timeout_s)
    else:
        log.info("docker host not probed", docker_host=docker_host, reason="unsupported scheme")
        return False
    try:
        conn.request("GET", "/_ping")
        resp = conn.getresponse()
        return resp.status == 200 and resp.read(16).strip() == b"OK"
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def harbor_docker_ready(env: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when Harbor's docker environment imports and its preflight command passes.

    Harbor's ``DockerEnvironment.preflight`` runs ``docker info`` (and exits the
    process on failure); the same command is run here, in ``env``, so the daemon
    asked is the one that was pinged.
    """
    try:
        module = importlib.import_module(HARBOR_DOCKER_MODULE)
        command: list[str] = module.DockerEnvironment._engine_cmd("info")
    except (ImportError, AttributeError) as exc:
        log.info("harbor docker environment unavailable", error=f"{type(exc).__name__}: {exc}")
        return False
    try:
        done = subprocess.run(command, env=dict(env), capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def bubblewrap_works(bwrap: str = "bwrap", timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when ``bwrap`` starts a process in fresh namespaces here."""
    try:
        done = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--unshare-all", "true"],
            capture_output=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def detect_environments(env: Mapping[str, str] | None = None) -> list[str]:
    """The environments this host can run: a subset of ``["docker", "local",
    "local.allowlist"]``.

    ``env`` is the environment the probes see (default: this process's); its
    ``DOCKER_HOST`` names the daemon, as for the docker CLI and SDK.
    """
    env = dict(os.environ if env is None else env)
    found: list[str] = []
    docker_host = env.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    if docker_ping(docker_host, PROBE_TIMEOUT_S / 5) and harbor_docker_ready(env):
        found.append("docker")
    if bubblewrap_works():
        found.append(LOCAL_ENVIRONMENT_ALIAS)
        if egress.enforceable():
            found.append(LOCAL_ALLOWLIST)
    return found


def detect_capabilities(
    labels: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> list[str]:
    """Detected environments, then the operator's ``labels`` (validated, deduplicated).

    Raises ValueError naming a label that cannot be a capability.
    """
    found = detect_environments(env)
    for label in labels:
        check_capability(label)
    caps = list(dict.fromkeys([*found, *labels]))
    log.info("runner capabilities", detected=found, labels=list(labels))
    return caps
