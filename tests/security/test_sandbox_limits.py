"""Resource bounds of the local sandbox: processes, build time, build log, private folders."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from services.localenv.builder import MAX_BUILD_LOG_BYTES
from services.localenv.errors import DockerfileBuildError
from tests.support.sandbox_env import EnvFactory, needs_sandbox, running, sh

pytestmark = needs_sandbox


async def test_a_fork_bomb_stops_at_the_process_limit(make_env: EnvFactory) -> None:
    env = make_env(pids_limit=64)
    # dash does not retry a failed fork: it reports it and goes on.
    spawn = (
        "/bin/sh -c 'for i in $(seq {n}); do sleep 60 & done; wait' >/dev/null 2>&1 & "
        "sleep 2; ls /proc | grep -c '^[0-9]'"
    )
    async with running(env):
        # Negative control: below the limit, processes start as usual.
        assert int(await sh(env, spawn.format(n=20))) >= 20
    async with running(env := make_env(pids_limit=64)):
        out = await env.exec(spawn.format(n=200))
        count = int((out.stdout or "0").strip())
        assert count <= 64, count
    default = make_env()
    async with running(default):
        sandbox = default._sandbox
        assert sandbox is not None and sandbox.spec.cgroup is not None
        assert sandbox.spec.cgroup.pids_limited
        limits = [
            (d / "pids.max").read_text().strip()
            for d in sandbox.spec.cgroup.dirs
            if (d / "pids.max").is_file()
        ]
        assert limits == ["4096"]


async def test_a_build_step_that_never_ends_is_stopped(make_env: EnvFactory) -> None:
    env = make_env("FROM ubuntu:24.04\nRUN sleep 600\n")
    env.task_env_config.build_timeout_sec = 3
    started = time.monotonic()
    with pytest.raises(DockerfileBuildError, match="exceeded its time limit"):
        await asyncio.wait_for(env.start(force_build=False), timeout=60)
    await env.stop(delete=True)
    assert time.monotonic() - started < 30


async def test_the_build_log_is_bounded(make_env: EnvFactory) -> None:
    # 40 MB of output from one RUN step: the log keeps its first 16 MiB and a note.
    env = make_env("FROM ubuntu:24.04\nRUN head -c 40000000 /dev/zero | tr '\\\\0' x; false\n")
    with pytest.raises(DockerfileBuildError):
        await env.start(force_build=False)
    await env.stop(delete=True)
    log = env.trial_paths.trial_dir / "environment-build.log"
    size = log.stat().st_size
    assert MAX_BUILD_LOG_BYTES <= size < MAX_BUILD_LOG_BYTES + 4096, size
    assert log.read_bytes().rstrip().endswith(b"[trialbus: build log truncated here]")


def _run_as_nobody(program: Path) -> subprocess.CompletedProcess[str]:
    # Through a shell: setpriv itself would exec the program before its capabilities go.
    return subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/bin/sh",
            "-c",
            'exec "$0"',
            str(program),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_setuid_files_of_a_trial_are_out_of_other_users_reach(
    make_env: EnvFactory,
) -> None:
    # Scratch under a world-traversable folder, as the default /tmp/trialbus-sandboxes is.
    base = Path(tempfile.mkdtemp(prefix="trialbus-sec-", dir="/tmp"))
    base.chmod(0o755)
    scratch, layers = base / "sandboxes", base / "layers"
    try:
        env = make_env(
            "FROM ubuntu:24.04\n"
            "RUN cp /usr/bin/id /opt/rootid-layer && chmod 4755 /opt/rootid-layer\n",
            scratch_dir=str(scratch),
            cache_dir=str(layers),
        )
        async with running(env):
            await sh(env, "cp /usr/bin/id /opt/rootid && chmod 4755 /opt/rootid")
            in_trial = env._root / "disk" / "upper" / "root" / "opt" / "rootid"  # the disk quota
            in_layer = next(layers.glob("*/fs/root/opt/rootid-layer"))
            for path in (in_trial, in_layer):
                # Negative control: the file is there, setuid root, for root to see.
                assert path.stat().st_mode & 0o4000 and path.stat().st_uid == 0
                tried = _run_as_nobody(path)
                assert "euid=0" not in tried.stdout, tried
                assert tried.returncode != 0 and "ermission denied" in tried.stderr, tried
            for folder in (scratch, layers, env._root):
                assert oct(os.stat(folder).st_mode & 0o777) == "0o700", folder
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_scratch_folder_owned_by_someone_else_is_refused(
    make_env: EnvFactory, tmp_path: Path
) -> None:
    squatted = tmp_path / "squatted"
    squatted.mkdir()
    os.chown(squatted, 65534, 65534)
    env = make_env(scratch_dir=str(squatted), cache_dir=str(squatted / "layers"))
    with pytest.raises(Exception, match="belongs to uid 65534"):
        await env.start(force_build=False)
    await env.stop(delete=True)
