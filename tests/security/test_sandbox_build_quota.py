"""A Dockerfile build cannot fill the host's disk: its layer is written on a disk of the
environment's quota (services/localenv/build_disk.py; issue 11).

A ``RUN`` step writing 100 MB under a 64 MB quota fails the build with an error naming
the quota; nothing stays mounted, no loop device and no image is left, and no layer is
cached. The negative control builds the same Dockerfile under a 256 MB quota: the
layer is built, copied out of its disk and holds the file, and a trial sees it, with
what the overlay needs of the copy (a deleted host file stays deleted, a replaced
folder stays opaque).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.localenv.disk import IMAGE_NAME
from services.localenv.errors import DockerfileBuildError
from tests.support.sandbox_env import EnvFactory, needs_sandbox, running, sh

pytestmark = needs_sandbox

DOCKERFILE = """\
FROM ubuntu:24.04
RUN rm /etc/debian_version && rm -rf /etc/skel && mkdir /etc/skel && touch /etc/skel/only
RUN head -c 100000000 /dev/zero > /opt/big
"""


def _loop_devices_under(folder: Path) -> list[str]:
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if str(folder) in line]


def _mounts_under(folder: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if f" {folder}/" in line]


async def test_a_build_step_writing_past_the_quota_fails_naming_it(
    make_env: EnvFactory, layers: Path
) -> None:
    env = make_env(DOCKERFILE, disk_mb=64)
    with pytest.raises(DockerfileBuildError) as info:
        await env.start(force_build=False)
    await env.stop(delete=True)
    message = str(info.value)
    assert "the environment build wrote past its disk quota of 64 MB" in message, message
    assert "TRIALBUS_SANDBOX_DISK_MB" in message
    assert "RUN head -c 100000000" in message  # the step that failed
    # Nothing left behind: no mount, no loop device, no image, no cached layer.
    assert _mounts_under(layers) == []
    assert _loop_devices_under(layers) == []
    assert list(layers.rglob(IMAGE_NAME)) == []
    assert not [p for p in layers.iterdir() if (p / "image.json").exists()]

    # Negative control: a quota the step fits in; the layer is built and used.
    env = make_env(DOCKERFILE, disk_mb=256)
    async with running(env):
        assert await sh(env, "stat -c %s /opt/big") == "100000000"
        # The copy out of the build's disk kept the overlay's whiteout and opaque folder.
        assert await sh(env, "test -e /etc/debian_version && echo there || echo gone") == "gone"
        assert await sh(env, "ls /etc/skel") == "only"
    assert _mounts_under(layers) == []
    assert _loop_devices_under(layers) == []
    assert list(layers.rglob(IMAGE_NAME)) == []
