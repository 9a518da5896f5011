"""The sandbox's seccomp filter: the calls no task needs fail with EPERM, in trials and builds.

Each probe (tests/security/seccomp_probe.py, raw calls through ctypes) runs once in a
sandbox with the filter and once, as the control, in one without it
(``seccomp: false``, the operator's switch): a call counts as refused by the filter
only where the control shows the kernel answering something else.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from services.localenv.environment import LocalEnvironment
from services.localenv.seccomp import denied_names, installer
from tests.security.seccomp_probe import PROBES
from tests.support.sandbox_env import EnvFactory, needs_sandbox, running, sh

pytestmark = needs_sandbox

PROBE = Path(__file__).with_name("seccomp_probe.py")
ALLOWED = {"ptrace_traceme", "personality_no_aslr"}
BLOCKED = set(PROBES) - ALLOWED
# Without the filter the kernel lets these through or answers another error on any
# kernel the suite runs on: each is a control that the EPERM is the filter's.
DISTINCT_WITHOUT_FILTER = {
    "unshare_newuser",
    "clone_newuser",
    "clone3",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "io_uring_setup",
}


async def _probe(env: LocalEnvironment, user: str | None = None) -> dict[str, object]:
    await env.upload_file(PROBE, "/tmp/seccomp_probe.py")
    out = await sh(env, "python3 /tmp/seccomp_probe.py", user=user)
    result: dict[str, object] = json.loads(out)
    return result


def _host_seccomp_mode() -> str:
    status = Path("/proc/self/status").read_text()
    return next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Seccomp:"))


def test_every_probe_is_a_call_the_filter_names() -> None:
    names = set(denied_names())
    for probe in BLOCKED:
        assert probe.removesuffix("_newuser") in names, probe
    for probe in ALLOWED:
        assert probe.split("_")[0] not in names, probe


def _spawn_status(preexec: Callable[[], None] | None) -> tuple[str, int]:
    probe = (
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -s '\\t\\n' '  '; unshare -U true"
    )
    done = subprocess.run(["sh", "-c", probe], preexec_fn=preexec, capture_output=True, text=True)
    return done.stdout.strip(), done.returncode


def test_the_installer_keeps_setuid_for_root_and_sets_no_new_privs_otherwise() -> None:
    install = installer()

    def as_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)
        install()

    assert _spawn_status(install) == ("NoNewPrivs: 0 Seccomp: 2", 1)
    assert _spawn_status(as_nobody) == ("NoNewPrivs: 1 Seccomp: 2", 1)
    assert _spawn_status(None) == (f"NoNewPrivs: 0 Seccomp: {_host_seccomp_mode()}", 0)  # control


async def test_blocked_calls_fail_with_eperm_and_pass_without_the_filter(
    make_env: EnvFactory,
) -> None:
    async with running(make_env()) as env:
        on = await _probe(env)
        as_user = await _probe(env, user="nobody")
        util = await env.exec("unshare --user true")
    async with running(make_env(seccomp=False)) as env:
        off = await _probe(env)
        util_off = await env.exec("unshare --user true")

    assert on["seccomp"] == as_user["seccomp"] == "2"
    assert off["seccomp"] == _host_seccomp_mode()
    for name in sorted(BLOCKED):
        expected = errno.ENOSYS if name == "clone3" else errno.EPERM
        assert on[name] == expected, (name, on[name])
        assert as_user[name] == expected, (name, as_user[name])
    controls = {name for name in BLOCKED if off[name] not in (errno.EPERM, errno.ENOSYS)}
    assert controls >= DISTINCT_WITHOUT_FILTER, off
    # A new user namespace works in the control: that is what the filter takes away.
    assert off["unshare_newuser"] == off["clone_newuser"] == 0
    assert (util_off.return_code, util.return_code) == (0, 1), util
    assert "Operation not permitted" in (util.stderr or "")
    # What debugging tasks need still works with the filter on.
    for name in sorted(ALLOWED):
        assert on[name] == off[name] == 0, (name, on[name], off[name])


async def test_dockerfile_run_steps_run_under_the_filter(make_env: EnvFactory) -> None:
    # The ENV line keeps the two builds apart in the layer cache.
    build = "FROM ubuntu:24.04\nENV FILTER={}\nRUN grep '^Seccomp:' /proc/self/status > /seccomp\n"
    build += "RUN unshare --user true && echo allowed > /userns || echo refused > /userns\n"
    async with running(make_env(build.format("on"))) as env:
        assert await sh(env, "cat /seccomp /userns") == "Seccomp:\t2\nrefused"
    async with running(make_env(build.format("off"), seccomp=False)) as env:
        mode = _host_seccomp_mode()
        assert await sh(env, "cat /seccomp /userns") == f"Seccomp:\t{mode}\nallowed"
