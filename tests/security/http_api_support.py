"""Driving the submitter's HTTP API as its own process (``python -m services.submitter``
under uvicorn, settings from the environment) on a free loopback port, and speaking raw
HTTP/1.1 to it where a client library would hide what the server did: whether it
answered before the body was sent, and whether it closed the connection.

Written against the environment and the wire only (no import of the code under test),
so the same tests can be run against an older checkout to show they fail there.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats

from schemas.subjects import Topology
from tests.support.api_client import EXAMPLE_TASKS
from tests.support.servers import Servers

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
"""A bound on start-up (the service waits for NATS); readiness itself is an event."""


async def work_messages(nats_url: str, topology: Topology) -> int:
    """Trials published on the topology's work stream."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(
            topology.work_stream, subjects_filter=topology.work_subject("*")
        )
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


def run_to_exit(
    env: dict[str, str], service: str = "services.submitter", timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``service`` (the API) to its exit (one that starts instead fails the bound)."""
    return subprocess.run(
        [sys.executable, "-m", service],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


TokenTable = dict[str, tuple[str, dict[str, object]]]
"""``{name: (token, identity fields)}``: who a test's tokens file lets in, by name."""


def random_tokens(**identities: dict[str, object]) -> TokenTable:
    """A fresh random token for each keyword, granted that keyword's identity fields
    (``alice={"user": "alice", "team": "red"}``)."""
    return {name: (secrets.token_urlsafe(32), fields) for name, fields in identities.items()}


def write_tokens_file(path: Path, entries: Mapping[str, tuple[str, dict[str, object]]]) -> Path:
    """A 0600 tokens file: ``{name: (token, identity fields)}`` -> the file's path."""
    lines = ["tokens:"]
    for token, fields in entries.values():
        extra = "".join(
            f", {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in fields.items()
        )
        lines.append(f"  - {{sha256: {hashlib.sha256(token.encode()).hexdigest()}{extra}}}")
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


Headers = Callable[[str], dict[str, str]]
"""``as_(name)``: the Authorization header of one named token."""


@asynccontextmanager
async def api_as_users(
    servers: Servers,
    tokens: Mapping[str, tuple[str, dict[str, object]]],
    **options: object,
) -> AsyncIterator[tuple[httpx.AsyncClient, Headers]]:
    """An in-process API on the test's NATS and ledger whose tokens file (in the test's
    folder) holds ``tokens`` (task paths inside the examples, no live-runner check), and
    ``as_``; ``options`` are further SubmitterSettings fields."""
    path = write_tokens_file(servers.tmp_path / "tokens.yaml", tokens)
    settings: dict[str, object] = {"tasks_root": EXAMPLE_TASKS, "check_runners": False}
    async with servers.api(api_tokens_file=path, **(settings | options)) as api:

        def as_(name: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tokens[name][0]}"}

        yield api, as_


def service_env(base: Mapping[str, str], **overrides: str) -> dict[str, str]:
    """The process environment: ours without TRIALBUS_*, then ``base`` and overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    # No runner runs in these tests: manifests are queued, not refused for want of one
    # (tests/integration/test_http_api.py covers that refusal).
    env["TRIALBUS_CHECK_RUNNERS"] = "false"
    env.update(base)
    env.update(overrides)
    return env


@dataclass(slots=True)
class ApiProcess:
    """A running submitter HTTP API."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_kib(self) -> int:
        """Resident memory of the server process, in KiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS line")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_service(module: str, env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m <module>`` with ``env``, output appended to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module],
            env=dict(env),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def wait_healthy(api: ApiProcess) -> None:
    """Return once /healthz answers 200 (fail with the log if the process exits)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if api.proc.poll() is not None:
            raise AssertionError(f"the API exited with {api.proc.returncode}:\n{api.log_tail()}")
        try:
            if httpx.get(f"{api.base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the API did not become healthy:\n{api.log_tail()}")
        time.sleep(0.05)  # polling a port that is not open yet: nothing to wait on


@dataclass(slots=True)
class RawAnswer:
    """What a raw HTTP exchange showed."""

    status: int | None
    """None: no answer arrived within the bound."""
    body: bytes
    sent: int
    """Body bytes the client had written when it stopped (answer seen, or send failed)."""
    closed: bool
    """The server closed the connection after its answer."""
    seconds: float
    """From the request's first byte to the end of the answer (or the bound)."""


def raw_request(
    port: int,
    head_lines: Iterable[str],
    body_chunks: Iterable[bytes] = (),
    *,
    answer_within_s: float = 10.0,
) -> RawAnswer:
    """Send a request head, then body chunks until the server answers; read the answer.

    Stops sending as soon as an answer is readable or a send fails, so a server that
    answers before the body needs no more than the head.
    """
    start = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=answer_within_s)
    try:
        sock.sendall(("\r\n".join(head_lines) + "\r\n\r\n").encode("latin-1"))
        sent = 0
        for chunk in body_chunks:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except OSError:  # reset / broken pipe / timed out: the server stopped reading
                break
            sent += len(chunk)
        data, closed = _read_answer(sock, start + answer_within_s)
    finally:
        sock.close()
    seconds = time.monotonic() - start
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        return RawAnswer(None, data, sent, closed, seconds)
    return RawAnswer(int(head.split()[1]), body, sent, closed, seconds)


def _read_answer(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """Bytes until the answer's body is complete (Content-Length), EOF or the deadline."""
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return data, False
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except OSError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and len(body) >= int(value):
                    return data, _closed_soon(sock, deadline)


def _closed_soon(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes the connection (EOF) before the deadline."""
    sock.settimeout(max(0.0, min(2.0, deadline - time.monotonic())))
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def zeros(total: int, chunk: int = 1024 * 1024) -> Iterable[bytes]:
    """``total`` zero bytes in chunks (one buffer reused)."""
    block = bytes(chunk)
    for offset in range(0, total, chunk):
        yield block[: min(chunk, total - offset)]


def chunked(payload: bytes, chunk: int = 64 * 1024) -> Iterable[bytes]:
    """``payload`` in HTTP/1.1 chunked transfer coding."""
    for i in range(0, len(payload), chunk):
        part = payload[i : i + chunk]
        yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
    yield b"0\r\n\r\n"


def head_then_body(port: int, head_lines: Iterable[str], body: bytes, quiet_s: float) -> RawAnswer:
    """Send the head, check the server stays silent for ``quiet_s`` (it waits for the
    body), then send the body and read the answer; ``status`` None if it spoke early."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head_lines) + "\r\n\r\n").encode("latin-1"))
        if select.select([sock], [], [], quiet_s)[0]:
            return RawAnswer(None, sock.recv(65536), 0, False, time.monotonic() - start)
        sock.sendall(body)
        data, closed = _read_answer(sock, time.monotonic() + 30)
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else None
    return RawAnswer(status, rest, len(body), closed, time.monotonic() - start)
