"""The multi-host harness (tests/support/netns.py) really isolates, with real processes.

Each invariant comes with the control showing the check can fail: what a host cannot
see or reach, the hub (or the same host) can; what dies with a host ran before.
Needs root and iproute2/util-linux; under CI=true their absence fails the tests.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from infra.embedded import NatsServer
from tests.conftest import skip_unless
from tests.support.netns import (
    HOST_DATA_DIR,
    MARKER_DIR,
    REPO,
    Host,
    HostDownError,
    Hosts,
    netns_pids,
    sweep_stale,
    unavailable_reason,
)

PY = sys.executable
# Exit 0 when a TCP connection to argv[1]:argv[2] succeeds, 1 (with the error) if not.
CONNECT = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    except OSError as exc:
        sys.exit(f"unreachable: {exc!r}")
""")


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    """Two hosts on a fresh bridge, removed after the test."""
    skip_unless(unavailable_reason())
    with Hosts(2, log_dir=tmp_path / "hosts") as made:
        yield made


def names_left(token: str) -> list[str]:
    """Namespaces and links of run ``token`` still on the machine."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in netns.splitlines() if f"-{token}-" in line]
    return found + [word for word in links.split() if token in word]


def test_a_host_talks_to_the_hub_nats_on_the_bridge(hosts: Hosts, tmp_path: Path) -> None:
    client = textwrap.dedent("""
        import asyncio, os, socket, sys
        import nats
        async def main():
            try:  # nats-py keeps retrying a refused first connect: bound it
                nc = await asyncio.wait_for(nats.connect(sys.argv[1], connect_timeout=2),
                                            float(sys.argv[3]))
            except Exception as exc:
                print(f"cannot connect: {exc!r}", file=sys.stderr, flush=True)
                os._exit(1)
            reply = await nc.request(sys.argv[2], socket.gethostname().encode(), timeout=10)
            print(reply.data.decode())
            await nc.close()
        asyncio.run(main())
    """)
    subject = f"netns.{secrets.token_hex(4)}"
    host = hosts[0]

    async def scenario(server: NatsServer) -> None:
        nc = await nats.connect(server.url)

        async def answer(msg: Msg) -> None:
            await msg.respond(b"hub saw " + msg.data)

        await nc.subscribe(subject, cb=answer)
        await nc.flush()
        proc = host.spawn([PY, "-c", client, server.url, subject, "20"])
        code = await asyncio.to_thread(proc.wait, 30)
        await nc.close()
        assert code == 0, proc.output()
        assert proc.stdout_path.read_text().strip() == f"hub saw {host.name}", proc.output()
        # Control: the same client fails where no server listens (it can fail).
        with socket.socket() as unused:  # a port bound but never listening: refused
            unused.bind((hosts.hub_address, 0))
            dead = f"nats://{hosts.hub_address}:{unused.getsockname()[1]}"
            failed = await asyncio.to_thread(host.run, [PY, "-c", client, dead, subject, "1"])
        assert failed.returncode == 1 and "cannot connect" in failed.stderr, failed

    with NatsServer(tmp_path / "nats", host=hosts.hub_address) as server:
        assert server.url == f"nats://{hosts.hub_address}:{server.port}"
        asyncio.run(scenario(server))
        # The server saw the client arrive from the host's own address, not loopback.
        with urllib.request.urlopen(f"{server.monitor_url}/connz?state=closed") as resp:
            ips = {c["ip"] for c in json.load(resp)["connections"]}
        assert host.address in ips, ips


def test_private_folders_are_private_to_each_host(hosts: Hosts) -> None:
    a, b = hosts
    tag = secrets.token_hex(4)
    files = [f"/tmp/{tag}", f"{HOST_DATA_DIR}/{tag}", f"/dev/shm/{tag}"]
    shared = f"/run/{tag}-shared"  # /run is not private: the control
    written = a.run(["sh", "-c", " && ".join(f"echo {a.name} > {f}" for f in [*files, shared])])
    assert written.returncode == 0, written
    hub_file = Path(f"/tmp/{tag}-hub")
    hub_file.write_text("hub")
    try:
        # Positive control: another process of the same host sees the files.
        again = a.run(["cat", *files])
        assert again.stdout.split() == [a.name] * len(files), again
        # The hub can look into a host's disk (Host.path), and finds them there only.
        assert a.path(files[1]).read_text().strip() == a.name
        assert not b.path(files[1]).exists()
        # Neither the other host nor the hub sees them, at the same paths.
        for path in files:
            assert b.run(["test", "-e", path]).returncode == 1, path
            assert not Path(path).exists(), path
        # Vice versa: the hub's /tmp is not the hosts'.
        assert a.run(["test", "-e", str(hub_file)]).returncode == 1
        assert b.run(["test", "-e", str(hub_file)]).returncode == 1
        # Control: a folder that is not private is shared, and the same checks see it.
        assert b.run(["cat", shared]).stdout.strip() == a.name
        assert Path(shared).read_text().strip() == a.name
        # The checkout is read-only inside a host (a shared path cannot be written by
        # luck), while the hub can write there.
        probe = Path(REPO) / f".netns-{tag}"
        refused = a.run(["touch", str(probe)])
        assert refused.returncode != 0 and "Read-only" in refused.stderr, refused
        probe.touch()
        probe.unlink()
    finally:
        hub_file.unlink(missing_ok=True)
        Path(shared).unlink(missing_ok=True)


def test_hidden_folders_look_empty_inside_hosts(tmp_path: Path) -> None:
    skip_unless(unavailable_reason())
    tasks = Path(REPO) / "examples" / "tasks"
    listing = sorted(p.name for p in tasks.iterdir())
    assert listing  # control: the hub sees the example tasks
    with Hosts(1, log_dir=tmp_path, hidden=[str(tasks)]) as hosts:
        assert hosts[0].run(["ls", "-A", str(tasks)]).stdout == ""
        # Control: without ``hidden`` a host sees the hub's checkout (read-only).
        assert hosts[0].run(["ls", str(tasks.parent)]).stdout.split() == sorted(
            p.name for p in tasks.parent.iterdir()
        )


def test_a_host_cannot_reach_the_hub_loopback(hosts: Hosts) -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as local,
        socket.create_server((hosts.hub_address, 0)) as bridged,
    ):
        lport, bport = local.getsockname()[1], bridged.getsockname()[1]
        # Control: from the hub (root namespace) the loopback server answers.
        hub = subprocess.run([PY, "-c", CONNECT, "127.0.0.1", str(lport)], capture_output=True)
        assert hub.returncode == 0, hub
        for host in hosts:
            # Neither as its own loopback nor through the bridge address.
            for addr in ("127.0.0.1", hosts.hub_address):
                probe = host.run([PY, "-c", CONNECT, addr, str(lport)])
                assert probe.returncode == 1 and "unreachable" in probe.stderr, (addr, probe)
            # Control: the same probe from the host reaches a server on the bridge.
            ok = host.run([PY, "-c", CONNECT, hosts.hub_address, str(bport)])
            assert ok.returncode == 0, ok


def test_killing_a_host_ends_all_its_processes_and_only_them(hosts: Hosts) -> None:
    a, b = hosts
    tag = secrets.token_hex(4)
    a_sleep = a.spawn(["sleep", "300"])
    # A sandboxed grandchild leaves the host's network namespace; it still dies with it.
    sandboxed = a.spawn(["unshare", "--net", "--fork", "sleep", "301"])
    b_sleep = b.spawn(["sleep", "302"])
    assert a.run(["sh", "-c", f"echo x > {HOST_DATA_DIR}/{tag}"]).returncode == 0
    a_pids = [a_sleep.pid, sandboxed.pid, *_descendants(sandboxed.pid)]
    assert len(a_pids) == 3 and all(_alive(p) for p in a_pids)  # control: all ran

    a.kill()

    assert not any(_alive(p) for p in a_pids), [p for p in a_pids if _alive(p)]
    assert a_sleep.poll() == -signal.SIGKILL and sandboxed.poll() == -signal.SIGKILL
    assert a.pids() == [] and not a.alive
    assert b_sleep.running and _alive(b_sleep.pid) and b.pids()
    with pytest.raises(HostDownError):
        a.spawn(["true"])
    # A reboot gives the same name and address with an empty disk.
    a.boot()
    assert a.run(["test", "-e", f"{HOST_DATA_DIR}/{tag}"]).returncode == 1
    assert a.run(["hostname"]).stdout.strip() == a.name


def test_cleanup_removes_everything_even_on_interrupt(tmp_path: Path) -> None:
    skip_unless(unavailable_reason())
    made = Hosts(2, log_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt), made:
        # Control: the names exist while the hosts are up.
        assert len(names_left(made.token)) >= 5, names_left(made.token)  # 2 ns, bridge, 2 veths
        made[0].spawn(["sleep", "300"])
        raise KeyboardInterrupt
    assert names_left(made.token) == []
    assert not (MARKER_DIR / made.token).exists()


def test_an_interrupt_while_creating_hosts_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_unless(unavailable_reason())
    real_boot = Host.boot
    booted: list[str] = []

    def boot_then_interrupt(host: Host) -> None:
        if host.index == 1:  # the second host: the first is up, bridge and veths exist
            booted.extend(names_left(host.name.split("-")[1]))
            raise KeyboardInterrupt
        real_boot(host)

    monkeypatch.setattr(Host, "boot", boot_then_interrupt)
    made = Hosts(2, log_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        made.start()
    assert len(booted) >= 5, booted  # control: there was something to clean up
    assert names_left(made.token) == []
    assert not (MARKER_DIR / made.token).exists()


def test_a_crashed_run_is_swept_and_a_live_one_is_not(tmp_path: Path) -> None:
    skip_unless(unavailable_reason())
    crashing = textwrap.dedent("""
        import time
        from tests.support.netns import Hosts
        hosts = Hosts(1).start()
        hosts[0].spawn(["sleep", "300"])
        print(hosts.token, hosts[0].name, flush=True)
        time.sleep(300)
    """)
    with Hosts(1, log_dir=tmp_path) as live:
        child = subprocess.Popen([PY, "-c", crashing], cwd=REPO, stdout=subprocess.PIPE)
        assert child.stdout is not None
        token, name = child.stdout.readline().decode().split()
        child.kill()  # SIGKILL: no cleanup code runs
        child.wait()
        # Its processes died with it (PDEATHSIG), but its names stay: the control.
        _wait_for(lambda: netns_pids(name) == [], f"processes of {name} to die")
        assert names_left(token)
        assert token in sweep_stale()
        assert names_left(token) == []
        # The live run was left alone.
        assert live.token in (m.name for m in MARKER_DIR.iterdir())
        assert live[0].run(["hostname"]).stdout.strip() == live[0].name


def test_bubblewrap_and_the_local_sandbox_run_inside_a_host(hosts: Hosts, tmp_path: Path) -> None:
    host = hosts[0]
    with socket.create_server((hosts.hub_address, 0)) as bridged:
        port = str(bridged.getsockname()[1])
        bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        inside = host.run([*bwrap, "--unshare-net", "--unshare-pid", PY, "-c", CONNECT,
                           hosts.hub_address, port])  # fmt: skip
        # bwrap runs, and its --unshare-net really cuts the hub off ...
        assert inside.returncode == 1 and "unreachable" in inside.stderr, inside
        # ... control: the same command without --unshare-net reaches it.
        shared = host.run([*bwrap, PY, "-c", CONNECT, hosts.hub_address, port])
        assert shared.returncode == 0, shared
    # The project's own sandbox (user namespace, overlays over /usr /etc /var, bwrap),
    # with its layers and trial folders on the host's private disk.
    trial = host.run([PY, "-c", LOCALENV_TRIAL, f"{HOST_DATA_DIR}/localenv"], timeout=120)
    assert trial.returncode == 0, trial
    assert trial.stdout.split() == ["trial", "written-inside"], trial
    assert not Path(f"{HOST_DATA_DIR}/localenv").exists()


LOCALENV_TRIAL = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
    from harbor.models.trial.paths import TrialPaths
    from services.localenv.environment import LocalEnvironment

    async def main(root):
        env_dir = root / "task" / "environment"
        env_dir.mkdir(parents=True)
        (env_dir / "Dockerfile").write_text("FROM ubuntu:24.04\\nWORKDIR /app\\n")
        paths = TrialPaths(root / "trial")
        paths.mkdir()
        env = LocalEnvironment(
            environment_dir=env_dir, environment_name="probe", session_id="probe__env",
            trial_paths=paths, task_env_config=EnvironmentConfig(),
            network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
            scratch_dir=str(root / "sandboxes"), cache_dir=str(root / "layers"))
        await env.start(force_build=False)
        try:
            result = await env.exec("hostname; echo written-inside > /app/f; cat /app/f")
            assert result.return_code == 0, result
            print(result.stdout)
        finally:
            await env.stop(delete=True)

    asyncio.run(main(Path(sys.argv[1])))
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(pid: int) -> list[int]:
    _wait_for(lambda: bool(_kids(pid)), f"a child of {pid}")
    return _kids(pid)


def _kids(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling interval for a state change we cannot await
