"""The local environment against the real kernel: overlays, namespaces, cgroups, network.

Each test builds a tiny task (no package downloads) and drives ``LocalEnvironment``
the way Harbor does: start, exec, transfers, stop. Layers are cached for the module.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from harbor.models.task.config import NetworkMode, NetworkPolicy

from services.localenv.environment import (
    ExecTimeoutError,
    UnsupportedEnvironmentError,
)
from tests.support.addresses import non_loopback_addresses
from tests.support.sandbox_env import (
    UBUNTU,
    EnvFactory,
    host_processes,
    layers,
    make_env,
    needs_sandbox,
    running,
    sh,
)

# The fixtures are imported so that pytest finds them in this module.
__all__ = ["layers", "make_env"]

pytestmark = needs_sandbox


async def test_writes_stay_in_their_own_trial(make_env: EnvFactory) -> None:
    probe = f"tb-probe-{uuid.uuid4().hex[:6]}"
    paths = [f"/usr/local/bin/{probe}", f"/etc/{probe}", f"/var/lib/{probe}", f"/root/{probe}"]
    async with running(make_env()) as a, running(make_env()) as b:
        await sh(a, "; ".join(f"echo x > {p}" for p in paths) + "; rm /etc/debian_version")
        assert await sh(a, f"cat {paths[0]}; test -e /etc/debian_version || echo gone") == "x\ngone"
        assert (
            await sh(b, " && ".join(f"test ! -e {p}" for p in paths) + " && echo clean") == "clean"
        )
        assert (
            await sh(b, "cat /etc/debian_version")
            == Path("/etc/debian_version").read_text().strip()
        )
    assert not any(Path(p).exists() for p in paths)
    assert Path("/etc/debian_version").is_file()


async def test_background_processes_persist_then_all_die(make_env: EnvFactory) -> None:
    marker = f"{time.time_ns() % 100000 + 100000}"
    env = make_env()
    async with running(env):
        await sh(
            env, f"setsid nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}1 >/dev/null 2>&1 &"
        )
        assert "sleep" in await sh(env, f"ps -eo args | grep '^sleep {marker}' | head -1")
        assert host_processes(f"sleep {marker}")
    # The namespace's pid 1 reaps every member before it exits, and stop() waits for it.
    assert host_processes(f"sleep {marker}") == []


async def test_a_chatty_background_process_blocks_nothing(make_env: EnvFactory) -> None:
    env = make_env()
    async with running(env):
        started = time.monotonic()
        out = await sh(env, "(while true; do echo spam; done) & echo started")
        assert "started" in out.split() and time.monotonic() - started < 5
        # It keeps writing (drained, not captured) while other commands run.
        first = await sh(env, "cat /proc/loadavg >/dev/null; pgrep -c -f 'while true' || true")
        assert int(first) >= 1
        assert await sh(env, "echo next") == "next"


async def test_fixed_ports_do_not_collide(make_env: EnvFactory) -> None:
    serve = (
        "head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /app/token; "
        "nohup python3 -m http.server 8765 --bind 127.0.0.1 --directory /app >/dev/null 2>&1 & "
        "for i in $(seq 100); do "
        "curl -fs localhost:8765/token >/dev/null && break; sleep 0.05; done"
    )
    async with running(make_env()) as a, running(make_env()) as b:
        await asyncio.gather(sh(a, serve), sh(b, serve))
        for env in (a, b):
            assert await sh(env, "curl -fs localhost:8765/token") == await sh(env, "cat /app/token")
        assert await sh(a, "cat /app/token") != await sh(b, "cat /app/token")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 8765)) != 0  # nothing leaked onto the host


async def test_network_mode_is_honoured(make_env: EnvFactory) -> None:
    async with running(make_env()) as offline, running(make_env(network=True)) as online:
        offline_links = await sh(offline, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert offline_links.split() == ["lo"]
        assert "tap0" in await sh(online, "tail -n +3 /proc/net/dev | cut -d: -f1")
        # The host's loopback services stay out of reach even with network.
        hosts = await sh(online, "cat /etc/resolv.conf")
        assert "10.0.2.3" in hosts


async def _hello(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"hello")
    await writer.drain()
    writer.close()


async def hello_server() -> tuple[asyncio.Server, str, int]:
    """A server that says hello on this machine's outside IPv4 address (never its
    loopback: what a trial with the network reaches), its address and port."""
    address = next(a for a in non_loopback_addresses() if ":" not in a)
    server = await asyncio.start_server(_hello, address, 0)
    return server, address, server.sockets[0].getsockname()[1]


async def test_the_network_follows_harbor_s_phase_policies(make_env: EnvFactory) -> None:
    """A setup with the network, an agent phase without, then a verifier phase with it
    again: Harbor switches through set_network_policy on the running sandbox."""
    server, address, port = await hello_server()
    probe = (
        "python3 -c 'import socket; "
        f'print(socket.create_connection(("{address}", {port}), 5).recv(5).decode())\''
    )
    links = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
    off = NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)
    on = NetworkPolicy(network_mode=NetworkMode.PUBLIC)
    async with server, running(make_env(phase_network_policies=[off, on])) as env:
        # Started offline (the baseline), but with the DNS a public phase will use.
        assert (await sh(env, links)).split() == ["lo"]
        assert "10.0.2.3" in await sh(env, "cat /etc/resolv.conf")
        assert (await env.exec(probe)).return_code != 0
        await env.set_network_policy(on)
        assert "tap0" in (await sh(env, links)).split()
        assert await sh(env, probe) == "hello"
        await env.set_network_policy(off)
        assert (await sh(env, links)).split() == ["lo"]
        assert (await env.exec(probe)).return_code != 0
        await env.set_network_policy(on)
        assert await sh(env, probe) == "hello"


PROXY_PROBE = """
import http.client, os, socket, sys, urllib.error, urllib.parse, urllib.request
mode, target = sys.argv[1], sys.argv[2]
try:
    if mode == "http":  # as any client does: through the proxy its environment names
        print(urllib.request.urlopen(target, timeout=10).read().decode())
    elif mode == "raw":  # through the proxy, whatever NO_PROXY says
        proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
        conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=10)
        conn.request("GET", target)
        answer = conn.getresponse()
        print(answer.status, answer.read().decode().strip())
    elif mode == "tunnel":  # CONNECT, as HTTPS clients do; what came after the answer
        proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
        with socket.create_connection((proxy.hostname, proxy.port), 10) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\\r\\n\\r\\n".encode())
            got = b""
            while chunk := s.recv(4096):
                got += chunk
        answer, _, rest = got.partition(b"\\r\\n\\r\\n")
        print(answer.split(b"\\r\\n")[0].decode(), rest.decode())
    else:  # straight out, no proxy
        host, port = target.rsplit(":", 1)
        print(socket.create_connection((host, int(port)), 5).recv(5).decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode().strip())
except OSError as exc:
    print("failed:", type(exc).__name__)
"""


async def test_an_allowlist_phase_reaches_its_hosts_through_the_proxy_and_nothing_else(
    make_env: EnvFactory,
) -> None:
    raw, address, raw_port = await hello_server()

    async def http_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nallowed")
        await writer.drain()
        writer.close()

    web = await asyncio.start_server(http_ok, address, 0)
    web_url = f"http://{address}:{web.sockets[0].getsockname()[1]}/x"
    raw_at = f"{address}:{raw_port}"
    off = NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)
    allow = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=[address])
    other = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["*.example.org"])
    on = NetworkPolicy(network_mode=NetworkMode.PUBLIC)

    async with web, raw, running(make_env(phase_network_policies=[allow, on])) as env:
        await sh(env, f"cat > /tmp/probe.py <<'EOF'\n{PROXY_PROBE}\nEOF")

        async def probe(mode: str, target: str) -> str:
            return await sh(env, f"python3 /tmp/probe.py {mode} {target}")

        await env.set_network_policy(allow)
        links = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
        assert (await sh(env, links)).split() == ["lo"]  # no route out but the proxy
        assert await probe("http", web_url) == "allowed"
        assert await probe("tunnel", raw_at) == "HTTP/1.1 200 Connection established hello"
        assert await probe("direct", raw_at) == "failed: OSError"
        refused = await probe("raw", "http://example.com/")
        assert refused == "403 trialbus egress: example.com is not in the task's allowed_hosts"
        # The host's loopback stays out of reach, even through an allowed name.
        await env.set_network_policy(
            NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["localhost"])
        )
        assert await probe("raw", "http://localhost:1/") == (
            "403 trialbus egress: localhost resolves only to addresses no trial may reach"
        )
        # Another phase's list applies at once; with the network off, nothing passes.
        await env.set_network_policy(other)
        assert await probe("http", web_url) == (
            f"403 trialbus egress: {address} is not in the task's allowed_hosts"
        )
        await env.set_network_policy(off)
        assert await probe("direct", raw_at) == "failed: OSError"
        assert "HTTP_PROXY" not in await sh(env, "env")
        # The control: public, the same server answers straight.
        await env.set_network_policy(on)
        assert await probe("direct", raw_at) == "hello"


HOSTILE_PROBE = """
import os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
def ask(data):
    with socket.create_connection((proxy.hostname, proxy.port), 10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return s.recv(200).split(b"\\r\\n")[0].decode()
print(ask(b"GET http://x/ HTTP/1.1\\r\\nX: " + b"a" * 70000 + b"\\r\\n\\r\\n"))
print(ask(b"GET http://x/ HTTP/1.1\\r\\nHost: x"))
print(ask(b"\\x16\\x03\\x01\\x02\\x00\\r\\n\\r\\n"))
print(ask(b"CONNECT " + sys.argv[1].encode() + b" HTTP/1.1\\r\\n\\r\\n"))
"""


async def test_the_egress_proxy_answers_hostile_requests_and_keeps_serving(
    make_env: EnvFactory,
) -> None:
    """What a trial sends the proxy is untrusted: an oversized or unfinished head and
    bytes that are not HTTP each get a 400, and the next request is served."""
    raw, address, port = await hello_server()
    allow = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=[address])
    async with raw, running(make_env(phase_network_policies=[allow])) as env:
        await env.set_network_policy(allow)
        await sh(env, f"cat > /tmp/hostile.py <<'EOF'\n{HOSTILE_PROBE}\nEOF")
        lines = (await sh(env, f"python3 /tmp/hostile.py {address}:{port}")).splitlines()
        assert lines == [
            "HTTP/1.1 400 Bad Request",  # a head over 64 KiB
            "HTTP/1.1 400 Bad Request",  # a head that never ends
            "HTTP/1.1 400 Bad Request",  # not HTTP
            "HTTP/1.1 200 Connection established",  # the control: still serving
        ]


async def test_memory_and_cpu_limits(make_env: EnvFactory) -> None:
    env = make_env(cpus=0.5, memory_mb=64)
    async with running(env):
        hog = "python3 -c 'b = bytearray(256 * 1024 * 1024); print(len(b))'"
        result = await env.exec(hog)
        assert result.return_code != 0
        assert (
            await env.exec("python3 -c 'print(len(bytearray(8 * 1024 * 1024)))'")
        ).return_code == 0
        sandbox = env._sandbox
        assert sandbox is not None and sandbox.spec.cgroup is not None
        wanted = ("memory.limit_in_bytes", "memory.max", "cpu.cfs_quota_us", "cpu.max")
        files = {
            name: (d / name).read_text().strip()
            for d in sandbox.spec.cgroup.dirs
            for name in wanted
            if (d / name).is_file()
        }
        limits = {k: v for k, v in files.items() if k in ("memory.limit_in_bytes", "memory.max")}
        assert set(limits.values()) == {str(64 * 1024 * 1024)}
        assert files.get("cpu.cfs_quota_us") == "50000" or files.get("cpu.max") == "50000 100000"
        dirs = sandbox.spec.cgroup.dirs
    assert not any(d.exists() for d in dirs)  # cgroups removed with the trial


async def test_timeout_kills_the_command(make_env: EnvFactory) -> None:
    env = make_env()
    async with running(env):
        started = time.monotonic()
        with pytest.raises(ExecTimeoutError):
            await env.exec("sleep 30", timeout_sec=1)
        assert time.monotonic() - started < 5
        assert await sh(env, "echo still-usable") == "still-usable"


async def test_transfers_cannot_follow_links_to_the_host(
    make_env: EnvFactory, tmp_path: Path
) -> None:
    name = f"tb-upload-{uuid.uuid4().hex[:6]}"
    local = tmp_path / "local.txt"
    local.write_text("payload")
    env = make_env()
    async with running(env):
        await sh(env, "ln -s /etc /app/hostetc && ln -s /etc/hostname /app/hostname-link")
        await env.upload_file(local, f"/app/hostetc/{name}")
        assert await sh(env, f"cat /etc/{name}") == "payload"
        await sh(env, "ln -s inside.txt /app/ok-link && echo in > /app/inside.txt")
        out = tmp_path / "download"
        await env.download_dir("/app", out)
        # Links out of the downloaded folder are dropped (a host reader would follow
        # them to host files); links that stay inside are kept.
        assert not os.path.lexists(out / "hostetc") and not os.path.lexists(out / "hostname-link")
        assert (out / "ok-link").is_symlink() and (out / "ok-link").read_text() == "in\n"
    assert not Path(f"/etc/{name}").exists()


async def test_image_config_users_and_cache(make_env: EnvFactory, layers: Path) -> None:
    dockerfile = (
        "FROM debian:bookworm\n"
        "RUN useradd -m -u 1234 tester && date +%s%N > /opt/built-at\n"
        "ENV FOO=bar\nUSER tester\nWORKDIR /home/tester/work\n"
    )
    first = make_env(dockerfile)
    async with running(first):
        assert await sh(first, "id -u; echo $FOO; pwd; echo $HOME") == (
            "1234\nbar\n/home/tester/work\n/home/tester"
        )
        assert await sh(first, "id -u", user="root") == "0"
        built_at = await sh(first, "cat /opt/built-at")
    assert (first.trial_paths.trial_dir / "environment-build.log").is_file()
    # Same definition: the cached layer is reused, nothing is rebuilt.
    second = make_env(dockerfile)
    async with running(second):
        assert await sh(second, "cat /opt/built-at") == built_at
    assert not (second.trial_paths.trial_dir / "environment-build.log").exists()


async def test_lent_tools_and_kernel_knobs(make_env: EnvFactory) -> None:
    env = make_env()
    async with running(env):
        assert (await sh(env, "uv --version")).startswith("uv ")
        assert await sh(env, ". $HOME/.local/bin/env && command -v uvx") == "/root/.local/bin/uvx"
        if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
            assert await sh(env, "echo $SSL_CERT_FILE") == "/etc/ssl/certs/ca-certificates.crt"
        denied = await env.exec("echo 1 > /proc/sys/kernel/sysrq || echo denied")
        assert "denied" in (denied.stdout or "")
        assert (await env.exec("mount -t tmpfs none /mnt")).return_code != 0


async def test_keep_sandbox(make_env: EnvFactory) -> None:
    kept = make_env(keep_sandbox=True)
    async with running(kept):
        await sh(kept, "echo kept > /app/f")
    # The upper folders are kept in the trial's disk image (the disk quota), unmounted:
    # read it without mounting it.
    out = await asyncio.to_thread(
        subprocess.run,
        ["debugfs", "-R", "cat /upper/root/app/f", str(kept._root / "disk.img")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "kept\n"
    shutil.rmtree(kept._root)
    dropped = make_env()
    async with running(dropped):
        pass
    assert not dropped._root.exists()


@pytest.mark.parametrize(
    ("dockerfile", "compose", "fragment"),
    [
        ("FROM node:20\n", False, "node:20"),
        ("FROM ubuntu:24.04 AS a\nFROM ubuntu:24.04\n", False, "multi-stage"),
        (UBUNTU, True, "docker compose"),
    ],
)
async def test_unsupported_definitions(
    make_env: EnvFactory, dockerfile: str, compose: bool, fragment: str
) -> None:
    env = make_env(dockerfile, files={"docker-compose.yaml": "services: {}\n"} if compose else {})
    with pytest.raises(UnsupportedEnvironmentError, match=fragment):
        await env.start(force_build=False)
    await env.stop(delete=True)


async def test_folders_with_spaces(make_env: EnvFactory, tmp_path: Path) -> None:
    spaced = tmp_path / "a folder with spaces"
    env = make_env(scratch_dir=str(spaced / "sandboxes"), cache_dir=str(spaced / "layers"))
    async with running(env):
        assert await sh(env, "echo ok > /app/x && cat /app/x") == "ok"
