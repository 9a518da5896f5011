"""The local sandbox's disk quota: a trial cannot fill the host's disk.

Each test writes past a small quota and shows the trial ended with the named reason
and the host holding no more than the quota; the same write under a larger quota (the
negative control) succeeds.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.localenv.disk import IMAGE_NAME, MOUNT_NAME, DiskQuota, sweep_stale
from services.localenv.environment import LocalEnvironment
from services.localenv.errors import DiskQuotaExceededError
from tests.support.sandbox_env import EnvFactory, needs_sandbox, running, sh

pytestmark = needs_sandbox

MB = 1 << 20
WRITE_100_MB = "head -c 100000000 /dev/zero > {path}"


def _trial_root(env: LocalEnvironment) -> Path:
    return env._root


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def _loop_devices_of(image: Path, timeout_s: float = 30.0) -> str:
    """The loop devices still bound to ``image`` once they had ``timeout_s`` to go (the
    kernel detaches an autoclear device after its last close, not at the unmount)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True)
        left = "\n".join(line for line in out.stdout.splitlines() if str(image) in line)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


async def test_a_write_past_the_quota_is_refused_and_ends_the_trial(
    make_env: EnvFactory,
) -> None:
    env = make_env(disk_mb=64)
    async with running(env):
        image = _trial_root(env) / IMAGE_NAME
        with pytest.raises(DiskQuotaExceededError, match="disk quota of 64 MB"):
            await env.exec(WRITE_100_MB.format(path="/tmp/big"))
        # The host holds no more than the quota: the image file cannot grow past it.
        assert image.stat().st_size == 64 * MB
        assert _allocated(image) <= 64 * MB
        # Final: the trial is over, every later command gets the same answer.
        with pytest.raises(DiskQuotaExceededError, match="disk quota"):
            await env.exec("true")
    # Cleaned up on the way out: no mount, no loop device, no image.
    assert not image.exists()
    assert not os.path.ismount(_trial_root(env) / MOUNT_NAME)
    assert _loop_devices_of(image) == ""

    # Negative control: under a larger quota the same write succeeds.
    async with running(env := make_env(disk_mb=256)):
        await sh(env, WRITE_100_MB.format(path="/tmp/big"))
        assert await sh(env, "stat -c %s /tmp/big") == "100000000"


async def test_the_log_folders_count_against_the_quota(make_env: EnvFactory) -> None:
    # /logs/agent is a host folder bound in (Harbor reads it): measured, not contained.
    env = make_env(disk_mb=64)
    async with running(env):
        with pytest.raises(DiskQuotaExceededError, match="95 MB written"):
            await env.exec(WRITE_100_MB.format(path="/logs/agent/big"))
    async with running(env := make_env(disk_mb=256)):
        await sh(env, WRITE_100_MB.format(path="/logs/agent/big"))


async def test_a_command_still_running_is_ended_by_the_watch(make_env: EnvFactory) -> None:
    env = make_env(disk_mb=64)
    async with running(env):
        started = time.monotonic()
        with pytest.raises(DiskQuotaExceededError):
            await asyncio.wait_for(
                env.exec(WRITE_100_MB.format(path="/logs/agent/big") + "; sleep 600"),
                timeout=60,
            )
        assert time.monotonic() - started < 30
    # Negative control: below the quota, the same command runs until its own end.
    async with running(env := make_env(disk_mb=256)):
        await sh(env, WRITE_100_MB.format(path="/logs/agent/big") + "; sleep 5")


async def test_the_task_storage_lowers_the_quota_and_zero_lifts_it(
    make_env: EnvFactory,
) -> None:
    env = make_env()  # the default quota, 10 GiB
    env.task_env_config.storage_mb = 48
    async with running(env):
        with pytest.raises(DiskQuotaExceededError, match="disk quota of 48 MB"):
            await env.exec(WRITE_100_MB.format(path="/big"))
    env = make_env(disk_mb=0)
    async with running(env):
        assert not (_trial_root(env) / IMAGE_NAME).exists()
        await sh(env, WRITE_100_MB.format(path="/big"))


_CRASHING_TRIAL = """
import logging, os, sys
from pathlib import Path
from services.localenv.disk import TrialDisk
disk = TrialDisk.create(Path(sys.argv[1]), 32 << 20, logging.getLogger())
assert disk is not None
os._exit(0)  # a runner killed mid-trial: nothing released
"""


def test_a_dead_trials_disk_is_released_by_the_next_trial(tmp_path: Path) -> None:
    scratch = tmp_path / "sand boxes"  # /proc/self/mountinfo escapes the space
    dead, live = scratch / "dead", scratch / "live"
    for root in (dead, live):
        subprocess.run(
            [sys.executable, "-c", _CRASHING_TRIAL, str(root)],
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        )
    # Negative control: a trial still alive holds its lock; its disk stays.
    lock = os.open(live / "disk.lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert os.path.ismount(dead / MOUNT_NAME)
        swept = sweep_stale(scratch, logging.getLogger("test"))
        assert swept == [dead]
        assert not os.path.ismount(dead / MOUNT_NAME)
        assert not (dead / IMAGE_NAME).exists()
        assert _loop_devices_of(dead / IMAGE_NAME) == ""
        assert os.path.ismount(live / MOUNT_NAME)
    finally:
        os.close(lock)
    assert sweep_stale(scratch, logging.getLogger("test")) == [live]
    assert _loop_devices_of(live / IMAGE_NAME) == ""


def test_without_a_disk_the_writes_are_measured(tmp_path: Path) -> None:
    # The fallback when no disk can be mounted (a runner without root): detection.
    upper = tmp_path / "upper"
    upper.mkdir()
    quota = DiskQuota(8 * MB, None, [upper])
    (upper / "small").write_bytes(b"x" * MB)
    assert quota.check() is None
    (upper / "big").write_bytes(b"x" * 9 * MB)
    reason = quota.check()
    assert reason is not None and "disk quota of 8 MB" in reason
