"""Capability detection against real programs: bubblewrap, the docker CLI, a daemon socket.

These machines have no container engine, so ``docker`` must be absent. The negative
control is a tiny HTTP server on a UNIX socket that speaks just enough of the Docker
Engine API (``/_ping`` answers ``OK``, every other GET an empty JSON object, which the
real ``docker info`` accepts): pointed at it, the same detection reports ``docker``.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.runner import capabilities
from services.runner.capabilities import (
    DEFAULT_DOCKER_HOST,
    bubblewrap_works,
    detect_capabilities,
    docker_ping,
)
from tests.conftest import skip_unless

pytestmark = pytest.mark.integration


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        # BaseHTTPRequestHandler expects (host, port) as the client address.
        request, _ = super().get_request()
        return request, ("local", 0)


def _handler(ping_status: int) -> type[http.server.BaseHTTPRequestHandler]:
    class FakeEngine(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/_ping"):
                status, body, ctype = ping_status, b"OK", "text/plain"
            else:
                status, body, ctype = 200, b"{}", "application/json"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Api-Version", "1.47")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep the test output clean

    return FakeEngine


def _serve(path: Path, ping_status: int) -> Iterator[str]:
    server = _UnixHTTPServer(str(path), _handler(ping_status))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake_engine(tmp_path: Path) -> Iterator[str]:
    """DOCKER_HOST of a fake daemon that answers the ping."""
    yield from _serve(tmp_path / "docker.sock", 200)


@pytest.fixture
def sick_engine(tmp_path: Path) -> Iterator[str]:
    """DOCKER_HOST of a daemon that is up but answers the ping with an error."""
    yield from _serve(tmp_path / "sick.sock", 500)


def _env(docker_host: str) -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": docker_host}


def test_no_engine_means_no_docker(tmp_path: Path) -> None:
    missing = f"unix://{tmp_path / 'no-daemon.sock'}"
    assert not docker_ping(missing)
    caps = detect_capabilities(env=_env(missing))
    assert "docker" not in caps
    # This machine's own default socket: no engine runs here, so nothing answers.
    if not Path(DEFAULT_DOCKER_HOST.removeprefix("unix://")).exists():
        assert "docker" not in detect_capabilities(env={"PATH": os.environ["PATH"]})


def test_a_daemon_answering_the_ping_is_found(fake_engine: str, sick_engine: str) -> None:
    assert docker_ping(fake_engine)
    assert not docker_ping(sick_engine)  # up, but not OK: no docker
    assert "docker" not in detect_capabilities(env=_env(sick_engine))


def test_docker_is_offered_when_the_daemon_and_harbors_preflight_answer(
    fake_engine: str,
) -> None:
    """The full detection's negative control: the same call that reports no docker on
    this machine reports it once a daemon (here the fake) answers."""
    if shutil.which("docker") is None:
        skip_unless("the docker CLI (Harbor's docker environment drives it) is not installed")
    assert "docker" in detect_capabilities(env=_env(fake_engine))


def test_local_follows_bubblewrap(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        skip_unless("bubblewrap is not installed: apt-get install bubblewrap")
    assert bubblewrap_works()
    assert "local" in detect_capabilities(env=_env(f"unix://{tmp_path / 'x.sock'}"))
    # Negative control: a bwrap that cannot start a sandbox is no capability.
    assert not bubblewrap_works(bwrap=str(tmp_path / "no-bwrap"))
    fake = tmp_path / "false-bwrap"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    assert not bubblewrap_works(bwrap=str(fake))


def test_local_allowlist_follows_bubblewrap_and_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner offers ``local.allowlist`` when it offers ``local`` and runs as root (the
    egress proxy enters the sandbox's network namespace: services/localenv/egress.py)."""
    if shutil.which("bwrap") is None:
        skip_unless("bubblewrap is not installed: apt-get install bubblewrap")
    if os.geteuid() != 0:
        skip_unless("the runner's allowlist needs root; run the tests as root")
    env = _env(f"unix://{tmp_path / 'x.sock'}")  # no daemon there: no docker
    assert detect_capabilities(env=env) == ["local", "local.allowlist"]
    # Negative controls: not root, or no sandbox, is no allowlist.
    with monkeypatch.context() as patch:
        patch.setattr(os, "geteuid", lambda: 1000)
        assert detect_capabilities(env=env) == ["local"]
    monkeypatch.setattr(capabilities, "bubblewrap_works", lambda: False)
    assert detect_capabilities(env=env) == []


def test_labels_are_appended_and_checked(tmp_path: Path) -> None:
    env = _env(f"unix://{tmp_path / 'x.sock'}")
    caps = detect_capabilities(["gpu", "gpu", "a100"], env=env)
    assert caps[-2:] == ["gpu", "a100"]
    with pytest.raises(ValueError, match="capability 'GPU!'"):
        detect_capabilities(["GPU!"], env=env)
