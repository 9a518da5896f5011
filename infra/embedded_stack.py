"""EmbeddedStack: nats-server, the SecantusDB ledger and the four services, each in
its own process, on one machine with nothing installed but this package.

A stack with its own nats-server runs it with authentication (infra.stack_nats): a
user per role in ``<data>/nats-auth`` (0700, files 0600), everything in JetStream
created as admin before any service starts, and each service handed its own role's
credentials file (``TRIALBUS_NATS_CREDENTIALS``). A stack given a ``nats_url`` uses
that server as it is (the tests' shared server has no users).

What runs it for an operator (``trialbus up`` / ``trialbus demo``) is infra.stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from infra.data_dir_lock import DataDirLock
from infra.embedded import LedgerServer, NatsServer, free_port
from infra.managed_process import LOOPBACK, StartStop
from infra.nats_auth import AuthFiles
from infra.service_process import ServiceProcess
from infra.stack_nats import (
    connect_stack,
    credentials_env,
    runner_ack_wait_s,
    stack_classes,
    start_authenticated_nats,
)
from infra.supervise import Supervised
from schemas.subjects import Topology

__all__ = ["LEDGER_ARGS", "EmbeddedStack", "stack_env"]


# secantusd's default leaves commits in WiredTiger's in-process log buffer: a SIGKILLed
# ledger lost 47 of 200 acknowledged inserts here, and the supervision test lost 8
# imported records (acked events, so never re-imported). Syncing every commit keeps
# whatever was acknowledged across a crash; the importer writes in batches, so the
# cost is small (20 batches of 200 records: 0.21 s without, 0.22 s with).
LEDGER_ARGS = ("--sync-on-commit",)


def stack_env(nats_url: str, ledger_url: str, prefix: str, ledger_db: str) -> dict[str, str]:
    """This process's environment without its TRIALBUS_* settings, pointed at one stack.

    What a trialbus process started for a stack (a service, a CLI command) is given:
    a setting left over from the caller must not send it to another installation.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        {
            "NATS_URL": nats_url,
            "LEDGER_URL": ledger_url,
            "TRIALBUS_PREFIX": prefix,
            "TRIALBUS_LEDGER_DB": ledger_db,
        }
    )
    return env


@dataclass
class EmbeddedStack(StartStop):
    """Servers (unless URLs are given) plus service processes."""

    data_dir: Path
    n_runners: int = 1
    concurrency: int = 4
    prefix: str = "trialbus"
    ledger_db: str = "trialbus"
    nats_url: str | None = None
    ledger_url: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    runner_env: Mapping[str, str] = field(default_factory=dict)
    http_port: int | None = None
    nats_port: int | None = None
    nats_host: str = LOOPBACK
    """Where the stack's own nats-server listens (runners on other hosts need an
    address they can reach, e.g. a bridge's)."""
    ledger_port: int | None = None
    fresh: bool = False
    """Empty the data folder first (the demo: never earlier results), once it is ours."""
    # What start() makes: the stack's state, never a constructor argument.
    _lock: DataDirLock | None = field(default=None, init=False)
    services: dict[str, ServiceProcess] = field(default_factory=dict, init=False)
    _nats: NatsServer | None = field(default=None, init=False)
    _ledger: LedgerServer | None = field(default=None, init=False)
    _api_tokens_file: Path | None = field(default=None, init=False)
    _auth: AuthFiles | None = field(default=None, init=False)

    @property
    def nats_auth_dir(self) -> Path:
        """0700 folder of the NATS server's auth include and each role's credentials."""
        return (self.data_dir / "nats-auth").resolve()

    @property
    def nats_auth(self) -> AuthFiles | None:
        """The generated auth files; None when NATS runs without authentication."""
        return self._auth

    def nats_credentials(self, role: str) -> Path | None:
        """``role``'s credentials file, None when NATS runs without authentication."""
        return self._auth.credentials[role] if self._auth is not None else None

    @property
    def jobs_dir(self) -> Path:
        return (self.data_dir / "jobs").resolve()

    @property
    def secrets_dir(self) -> Path:
        """0700 folder of this stack's secrets (the HTTP API's tokens file, the token)."""
        return (self.data_dir / "secrets").resolve()

    @property
    def api_token_path(self) -> Path:
        """The operator's HTTP API token (admin identity), readable by its owner only."""
        return self.secrets_dir / "api-token"

    def ensure_api_token(self) -> Path:
        """Give the HTTP API a tokens file with one admin token for this stack's operator.

        The tokens file holds only the token's sha256; the token itself is written once
        to ``api_token_path`` (0600) for local clients (`curl -H "Authorization: Bearer
        $(cat ...)"`). Kept across restarts of the stack, like its data.
        """
        from services.submitter.api_tokens import issue_token

        tokens_file = self.secrets_dir / "api-tokens.yaml"
        self.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.secrets_dir, 0o700)
        if not tokens_file.exists() or not self.api_token_path.exists():
            tokens_file.unlink(missing_ok=True)
            token = issue_token(tokens_file, user="operator", admin=True)
            fd = os.open(self.api_token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(token + "\n")
        return tokens_file

    def start(self) -> Self:
        """Start the servers it owns, then every service; return once all are ready.

        Raises DataDirInUse (nothing started) while another process runs a stack on
        the same data folder."""
        lock = DataDirLock(self.data_dir)
        lock.acquire()
        self._lock = lock
        with self.stopped_on_failure():
            if self.fresh:
                lock.empty()
            if self.nats_url is None:
                self._nats, self._auth = start_authenticated_nats(
                    self.data_dir / "nats",
                    self.nats_auth_dir,
                    Topology(self.prefix),
                    port=self.nats_port,
                    host=self.nats_host,
                    ack_wait_s=runner_ack_wait_s({**self.extra_env, **self.runner_env}),
                    classes=stack_classes({**self.extra_env, **self.runner_env}),
                )
                self.nats_url = self._nats.url
            if self.ledger_url is None:
                self._ledger = LedgerServer(
                    self.data_dir / "ledger", port=self.ledger_port, extra_args=LEDGER_ARGS
                ).start()
                self.ledger_url = self._ledger.url
            self.http_port = self.http_port or free_port()
            self._api_tokens_file = self.ensure_api_token()
            for name in ("importer", "watcher", "submitter"):
                self._add(name, credentials_env(self._auth, name))
            for i in range(self.n_runners):
                self._add(
                    f"runner-{i}",
                    {
                        "TRIALBUS_RUNNER_ID": f"runner-{i}",
                        **self.runner_env,
                        **credentials_env(self._auth, "runner"),
                    },
                )
            for svc in self.services.values():
                svc.start()
            self.wait_ready()
        return self

    def _env(self) -> dict[str, str]:
        assert self.nats_url and self.ledger_url
        env = stack_env(self.nats_url, self.ledger_url, self.prefix, self.ledger_db)
        env.update(
            {
                "TRIALBUS_JOBS_DIR": str(self.jobs_dir),
                "TRIALBUS_CONCURRENCY": str(self.concurrency),
                "TRIALBUS_HTTP_PORT": str(self.http_port),
                "TRIALBUS_LOG_JSON": "true",
                "TRIALBUS_SANDBOX_DIR": str((self.data_dir / "sandboxes").resolve()),
                # Every role's credentials, the ledger's and NATS's data, the API token:
                # no local trial may see this folder, wherever the operator put it.
                "TRIALBUS_SANDBOX_HIDE": json.dumps([str(self.data_dir.resolve())]),
                # The runners' own disk (trial folders until stored, the task cache);
                # jobs_dir is the importer's: the job folders it rebuilds from the bucket.
                "TRIALBUS_WORK_DIR": str((self.data_dir / "runner").resolve()),
            }
        )
        if self._api_tokens_file is not None:
            env["TRIALBUS_API_TOKENS_FILE"] = str(self._api_tokens_file)
        env.update(self.extra_env)
        return env

    def _add(self, name: str, env: Mapping[str, str]) -> None:
        self.services[name] = ServiceProcess(
            name, {**self._env(), **env}, self.data_dir / "logs" / f"{name}.log"
        )

    def add_runner(self, env: Mapping[str, str] | None = None) -> ServiceProcess:
        """Start one more runner process (scaling out, or replacing a killed one)."""
        i = sum(1 for n in self.services if n.startswith("runner-"))
        name = f"runner-{i}"
        self._add(
            name,
            {
                "TRIALBUS_RUNNER_ID": name,
                **self.runner_env,
                **(env or {}),
                **credentials_env(self._auth, "runner"),
            },
        )
        self.services[name].start()
        return self.services[name]

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every service pulls from its durable consumer / answers on HTTP.

        Without authentication the services declare their durables, so one existing is
        the sign; with it the admin made them beforehand, so the sign is a pull request
        waiting on each (a consumer bound and fetching). A stack with ``n_runners=0``
        does not wait for the runners' durable: its runners join from elsewhere.
        """
        asyncio.run(self._wait_ready(timeout))

    async def _wait_ready(self, timeout_s: float) -> None:
        from nats.errors import TimeoutError as NatsTimeoutError
        from nats.js.errors import NotFoundError

        topo = Topology(self.prefix)
        durables = [
            (topo.events_stream, topo.importer_durable),
            (topo.events_stream, topo.watcher_durable),
        ]
        if self.n_runners:  # runners started elsewhere (other hosts) are not awaited
            durables.append((topo.work_stream, topo.runner_durable))
        deadline = time.monotonic() + timeout_s
        nc = await connect_stack(self.nats_url or "", self._auth)
        try:
            js = nc.jetstream()
            pending = list(durables)
            while pending:
                self._raise_if_dead()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"services not ready after {timeout_s:.0f}s: {pending}")
                still = []
                for stream, durable in pending:
                    try:
                        info = await js.consumer_info(stream, durable)
                    except (NotFoundError, NatsTimeoutError):
                        # Not there yet, or no answer in time (a replicated cluster's
                        # meta leader busy creating the streams): ask again.
                        still.append((stream, durable))
                        continue
                    if self._auth is not None and not info.num_waiting:
                        still.append((stream, durable))
                pending = still
                if pending:
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()
        await self._wait_http(deadline)

    async def _wait_http(self, deadline: float) -> None:
        import httpx

        async with httpx.AsyncClient() as client:
            while True:
                self._raise_if_dead()
                with contextlib.suppress(httpx.HTTPError):
                    r = await client.get(f"http://127.0.0.1:{self.http_port}/healthz", timeout=1)
                    if r.status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError("submitter HTTP API not ready")
                await asyncio.sleep(0.1)

    def _raise_if_dead(self) -> None:
        for svc in self.services.values():
            if svc.proc is not None and svc.proc.poll() is not None:
                tail = (
                    svc.log_path.read_text(errors="replace")[-3000:]
                    if svc.log_path.exists()
                    else ""
                )
                raise RuntimeError(f"service {svc.name} exited with {svc.proc.returncode}:\n{tail}")

    def children(self) -> list[Supervised]:
        """Every process this stack started: its servers first, then the services."""
        servers: list[Supervised] = [x for x in (self._nats, self._ledger) if x is not None]
        return [*servers, *self.services.values()]

    def stop(self) -> None:
        """Stop services (runners drain first), then the ledger and NATS."""
        runners = [s for n, s in self.services.items() if n.startswith("runner")]
        others = [s for n, s in self.services.items() if not n.startswith("runner")]
        for s in runners + others:
            s.signal(signal.SIGTERM)
        for s in runners + others:
            s.stop()
        if self._ledger is not None:
            self._ledger.stop()
        if self._nats is not None:
            self._nats.stop()
        if self._lock is not None:
            self._lock.release()  # idempotent: a second stop() is harmless
