"""``trialbus up`` runs its bus with authentication, and every part works under its role.

One stack per module, run exactly as ``trialbus up`` runs it (``infra.stack.serve`` in
its own process: its own nats-server and ledger, free ports, the instant executor).
The tests read what it wrote (the stack file, ``<data>/nats-auth``) and act as clients:
an anonymous client and a runner publishing work are refused by the server; an
experiment submitted through the CLI, which finds its credentials through the stack
file, completes with every trial in the ledger (the positive control: each service
works as its own role); a supervised restart of nats-server keeps the users.
The selection of a role's file by ``settings_for`` is checked without a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pymongo
import pytest
from nats.errors import Error as NatsError

from benchmarks.instant_executor import EXECUTOR_SPEC
from infra.nats_auth import AUTH_CONF, RoleCredentials, connect_as, load_credentials
from infra.nats_permissions import ROLES
from schemas.subjects import Topology
from services.common.settings import CommonSettings, SubmitterSettings
from services.common.stackfile import settings_for, write_stack_file
from tests.support.bus_roles import require_nats_server
from tests.support.manifests import nop_manifest
from tests.support.stack_console import StackConsole, launched

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

TRIALBUS = Path(sys.executable).with_name("trialbus")
TOPO = Topology("trialbus")
N_TRIALS = 8
REFUSAL_WAIT_S = 60.0
"""Bound on how long the server takes to report a refusal (an event, not a sleep)."""

RUNNER_ENV = {"TRIALBUS_EXECUTOR": EXECUTOR_SPEC, "TRIALBUS_INSTANT_DELAY_S": "0.2"}


class Up(StackConsole):
    """The stack's process, its console, and what it wrote: URLs and credentials."""

    @property
    def url(self) -> str:
        return str(self.stack["nats_url"])

    @property
    def auth_dir(self) -> Path:
        return Path(self.stack["nats_credentials_dir"])

    def credentials(self, role: str) -> RoleCredentials:
        return load_credentials(self.auth_dir / f"{role}.json", role)

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``trialbus ARGS`` as a user runs it: nothing but the stack file (and ``env``)."""
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TRIALBUS_") and k not in {"NATS_URL", "LEDGER_URL"}
        }
        base.update(TRIALBUS_STACK_FILE=str(self.stack_file), **env)
        return subprocess.run(
            [str(TRIALBUS), *args], env=base, capture_output=True, text=True, timeout=300
        )


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    require_nats_server()
    root = tmp_path_factory.mktemp("stack-auth")
    with launched(root, RUNNER_ENV, Up) as handle:
        handle.wait_line("trialbus is up", timeout=120)
        yield handle


def _loose(path: Path, mode: int) -> bool:
    """True when ``path``'s permission bits are wider than ``mode``."""
    return bool(stat.S_IMODE(path.stat().st_mode) & ~mode)


def test_console_and_stack_file_name_the_credentials_and_hold_no_secret(up: Up) -> None:
    line = next(x for x in up.lines if "trialbus is up" in x)
    assert f"authentication required: credentials per role in {up.auth_dir}" in line
    assert up.auth_dir == (up.data_dir / "nats-auth").resolve()
    passwords = [up.credentials(role).password for role in ROLES]
    # Negative control of the search: each password is in its own file.
    assert all(
        p in (up.auth_dir / f"{r}.json").read_text() for r, p in zip(ROLES, passwords, strict=True)
    )
    exposed = [up.stack_file.read_text(), "\n".join(up.lines)]
    exposed += [p.read_text(errors="replace") for p in (up.data_dir / "logs").glob("*.log")]
    for name in ("nats-server.conf", "nats-server.log"):
        exposed.append(up.data_dir.joinpath("nats", name).read_text(errors="replace"))
    assert not [p for p in passwords if any(p in text for text in exposed)]


def test_auth_files_are_private(up: Up, tmp_path: Path) -> None:
    assert stat.S_IMODE(up.auth_dir.stat().st_mode) == 0o700
    files = sorted(p.name for p in up.auth_dir.iterdir())
    assert files == sorted([AUTH_CONF, *(f"{r}.json" for r in ROLES)])
    assert [p.name for p in up.auth_dir.iterdir() if _loose(p, 0o600)] == []
    # Negative control of the check: a file readable by others is caught.
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0o644)
    assert _loose(probe, 0o600)


async def _refused_anonymous(url: str) -> str:
    """The error an anonymous connection gets (fails the test if it is let in)."""
    try:
        nc = await nats.connect(servers=[url], allow_reconnect=False, connect_timeout=5)
    except (NatsError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await nc.close()
    pytest.fail(f"an anonymous client was let into {url}")


async def test_anonymous_client_is_refused(up: Up) -> None:
    assert "authorization" in (await _refused_anonymous(up.url)).lower()
    # Negative control: the same server lets a role in.
    nc = await connect_as([up.url], up.credentials("submitter"), name="control")
    await nc.close()


async def test_runner_cannot_publish_work(up: Up) -> None:
    errors: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        await errors.put(str(exc))

    nc = await connect_as([up.url], up.credentials("runner"), name="forger", error_cb=on_error)
    try:
        # Control first, on the same connection: the server handles a client's messages
        # in order, so if the first refusal is the work subject's, the live log line
        # (a subject the runner may publish to) was let through.
        await nc.publish(TOPO.log_subject("stack-auth", "trial-0"), b"{}")
        await nc.publish(TOPO.work_subject("stack-auth"), b"{}")
        await nc.flush()
        err = await asyncio.wait_for(errors.get(), REFUSAL_WAIT_S)
    finally:
        await nc.close()
    assert f'permissions violation for publish to "{TOPO.work_subject("stack-auth")}"' in (
        err.lower()
    )
    # The server logs each refusal with the client's name (the next test relies on it);
    # the line may land a moment after the client hears of it.
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while not any(_is_forgers(line) for line in _violations(up)):
        assert time.monotonic() < deadline, "nats-server did not log the refusal"
        await asyncio.sleep(0.05)  # re-check interval of an observed condition


def _is_forgers(line: str) -> bool:
    """The forger's refusal: the one publish to the work subject this module makes
    (matched by subject, which the server always logs, not by the client's name)."""
    return f'Subject "{TOPO.work_subject("stack-auth")}"' in line


def _violations(up: Up) -> list[str]:
    """Lines of the stack's nats-server log reporting a refused publish or subscribe."""
    log = up.data_dir / "nats" / "nats-server.log"
    return [x for x in log.read_text(errors="replace").splitlines() if "Violation" in x]


def _write_manifest(folder: Path) -> Path:
    return nop_manifest(folder, "stack-auth", agents=2, repetitions=N_TRIALS // 2, concurrency=8)


def test_cli_submission_through_the_stack_file_completes(up: Up, tmp_path: Path) -> None:
    done = up.cli("submit", str(_write_manifest(tmp_path)), "--wait", "--json", "--timeout", "240")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    experiment_id = json.loads(done.stdout)["experiment_id"]
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(up.stack["ledger_url"])
    try:
        records = list(client["trialbus"]["trials"].find({"experiment_id": experiment_id}))
    finally:
        client.close()
    assert len({r["trial_id"] for r in records}) == N_TRIALS
    assert [r["trial_id"] for r in records if not r["evaluation"]["reward_valid"]] == []
    status = up.cli("status", experiment_id, "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    # No service was refused anything along the way (retried denials would not show
    # above); only this module's deliberate forger was.
    assert [x for x in _violations(up) if not _is_forgers(x)] == []


def test_cli_without_credentials_is_told_the_login_was_refused(up: Up, tmp_path: Path) -> None:
    # NATS_URL from the environment: the stack file's credentials are then not used.
    done = up.cli("cancel", "stack-auth-none", "--json", NATS_URL=up.url)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "refused the login without credentials" in done.stderr
    assert "TRIALBUS_NATS_CREDENTIALS" in done.stderr
    # Negative control: the same command with the stack file's credentials goes through.
    done = up.cli("cancel", "stack-auth-none", "--json")
    assert done.returncode == 0, done.stdout + done.stderr


async def test_nats_server_restarted_by_supervision_keeps_its_users(up: Up) -> None:
    pid = _nats_pid(up)
    mark = len(up.lines)
    os.kill(pid, signal.SIGKILL)
    up.wait_line("nats-server restarted (pid", timeout=60, after=mark)
    assert "authorization" in (await _refused_anonymous(up.url)).lower()
    nc = await connect_as([up.url], up.credentials("admin"), name="control")
    try:
        info = await nc.jetstream().consumer_info(TOPO.work_stream, TOPO.runner_durable)
        assert info.name == TOPO.runner_durable  # the admin's objects survived too
    finally:
        await nc.close()


def _nats_pid(up: Up) -> int:
    """Pid of the stack's nats-server (a direct child of the stack's process)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == up.proc.pid and argv[0].endswith(b"nats-server"):
            return int(entry)
    raise AssertionError("the stack has no nats-server child")


# -- which file a CLI command uses (no server) ----------------------------------------
@pytest.fixture
def stack_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("NATS_URL", "TRIALBUS_NATS_URL", "TRIALBUS_NATS_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "stack.json"
    monkeypatch.setenv("TRIALBUS_STACK_FILE", str(path))
    write_stack_file(
        path,
        nats_url="nats://127.0.0.1:14222",
        ledger_url="mongodb://127.0.0.1:17017",
        jobs_dir=tmp_path / "jobs",
        pid=os.getpid(),
        nats_credentials_dir=tmp_path / "auth",
    )
    return path


def test_commands_pick_their_role_from_the_stack_file(stack_file: Path) -> None:
    auth = stack_file.parent / "auth"
    assert settings_for(SubmitterSettings).nats_credentials == auth / "submitter.json"
    assert settings_for(CommonSettings).nats_credentials == auth / "submitter.json"
    imp = settings_for(CommonSettings, role="importer")
    assert imp.nats_credentials == auth / "importer.json"


def test_credentials_follow_the_url_they_belong_to(
    stack_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_URL", "nats://elsewhere:4222")
    assert settings_for(CommonSettings).nats_credentials is None  # not that server's
    monkeypatch.setenv("TRIALBUS_NATS_CREDENTIALS", "/etc/trialbus/runner.json")
    assert settings_for(CommonSettings).nats_credentials == Path("/etc/trialbus/runner.json")
    monkeypatch.delenv("NATS_URL")
    # The environment's file wins over the stack file's, with the file's URL.
    assert settings_for(CommonSettings).nats_credentials == Path("/etc/trialbus/runner.json")
