"""The capability bound holds: nothing a trial plants runs with more than Docker's caps.

A command enters the sandbox through host helpers (a cgroup join, nsenter, setpriv).
Before the fix, setpriv was found by bare name on the trial's own PATH *after*
entering the trial's root, and every helper ran with the trial's environment
(LD_PRELOAD included) - as host root for the ones outside the sandbox.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest

from tests.support.sandbox_env import EnvFactory, needs_sandbox, running, sh

pytestmark = needs_sandbox

# CapBnd of a root exec: Docker's default set (chown ... setfcap), bits 0-8,10,13,27,29,31.
DOCKER_CAPBND = "00000000a80425fb"
PLANTED = "/logs/agent/planted-helper-ran"


async def test_a_helper_planted_on_path_or_in_usr_never_runs(make_env: EnvFactory) -> None:
    env = make_env()
    marker = env.trial_paths.agent_dir / "planted-helper-ran"
    fake = (
        "#!/bin/sh\n"
        f'echo "$0 $(grep CapBnd /proc/self/status)" >> {PLANTED}\n'
        'exec "/usr/bin/$(basename "$0").real" "$@"\n'
    )
    async with running(env):
        assert await sh(env, "grep CapBnd /proc/self/status | cut -f2") == DOCKER_CAPBND
        plant = []
        for name in ("setpriv", "prlimit", "nsenter", "env"):
            plant.append(
                f"cp /usr/bin/{name} /usr/bin/{name}.real && printf '%s' \"$FAKE\" > "
                f"/usr/bin/{name} && chmod 755 /usr/bin/{name} && "
                f"cp /usr/bin/{name} /usr/local/sbin/{name}"
            )
        await sh(env, " && ".join(plant), env={"FAKE": fake})
        # Negative control: the planted programs do run when the trial itself calls them.
        await sh(env, "setpriv --version >/dev/null")
        assert marker.is_file()
        marker.unlink()
        for _ in range(2):
            assert await sh(env, "grep CapBnd /proc/self/status | cut -f2") == DOCKER_CAPBND
        assert not marker.exists(), marker.read_text()


async def test_a_preload_library_planted_by_the_trial_never_loads_into_a_helper(
    make_env: EnvFactory,
) -> None:
    if shutil.which("gcc") is None:
        pytest.fail("this test compiles its probe with the host's gcc (apt-get install gcc)")
    probe = (
        "#include <stdio.h>\n#include <sys/prctl.h>\n#include <linux/capability.h>\n"
        "__attribute__((constructor)) static void probe(void) {\n"
        "  if (prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN) == 1) {\n"
        '    FILE *f = fopen("/logs/agent/preload-ran", "a");\n'
        '    if (f) { fputs("loaded with CAP_SYS_ADMIN in the bound\\n", f); fclose(f); }\n'
        "  }\n}\n"
    )
    env = make_env()
    marker = env.trial_paths.agent_dir / "preload-ran"
    async with running(env):
        await sh(
            env,
            'printf "%s" "$SRC" > /tmp/p.c && gcc -shared -fPIC -o /usr/lib/p.so /tmp/p.c',
            env={"SRC": probe},
        )
        # The loader reads /etc/ld.so.preload however it is started: the file is masked.
        planted = await env.exec("echo /usr/lib/p.so > /etc/ld.so.preload")
        assert planted.return_code != 0 and "Read-only" in (planted.stderr or "")
        # Negative control: the library does load into the trial's own processes.
        preload = {"LD_PRELOAD": "/usr/lib/p.so"}
        assert int(await sh(env, "grep -c p.so /proc/self/maps", env=preload)) >= 1
        for _ in range(2):
            capbnd = await sh(env, "grep CapBnd /proc/self/status | cut -f2", env=preload)
            assert capbnd == DOCKER_CAPBND
    assert not marker.exists(), marker.read_text()


async def test_the_trials_environment_does_not_reach_the_host_helpers(
    make_env: EnvFactory, tmp_path: Path
) -> None:
    # A host-only file named by the task's ENV LD_PRELOAD: a host-side helper that
    # honours it finds the file ("file too short"); the trial's processes cannot see it.
    host_only = tmp_path / "host-only.so"
    host_only.write_text("not a library\n")
    env = make_env(f"FROM ubuntu:24.04\nENV LD_PRELOAD={host_only}\nWORKDIR /app\n")
    async with running(env):
        result = await env.exec("echo ok")
        assert (result.stdout or "").strip() == "ok"
        # Inside, the path does not exist: every complaint must be "cannot open".
        complaints = [ln for ln in (result.stderr or "").splitlines() if "LD_PRELOAD" in ln]
        assert all("cannot open shared object file" in ln for ln in complaints), complaints
        # Negative control: the trial's own processes do get the variable.
        assert await sh(env, "echo $LD_PRELOAD") == str(host_only)


async def test_the_runners_environment_does_not_reach_the_trial(
    make_env: EnvFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = secrets.token_hex(12)
    monkeypatch.setenv("TRIALBUS_RUNNER_SECRET_PROBE", token)
    env = make_env()
    async with running(env):
        seen = await sh(env, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u")
        assert token not in seen
        # Negative control: what the trial is given does show up.
        assert "HOME=/root" in seen.splitlines()
