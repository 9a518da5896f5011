"""A runner killed outright leaves its trials' disks mounted; the next runner releases them.

A real runner process runs a trial in the local environment under a 64 MB disk quota
(its agent, tests/support/disk_agent.py, writes 8 MB and sleeps). Once the trial's
disk is mounted, the runner's whole process group gets SIGKILL: the mount, its loop
device and its image stay (checked: the state the fix is for). A new runner on the same
sandbox folder (in a pool with no work, so it starts no trial of its own) releases
them when it starts and says so in its log.

Negative controls, each a disk made by a separate process that the new runner must not
touch: a live trial's (its lock held) in the same sandbox folder, a dead trial's in
another folder (someone else's sandbox folder), and a dead trial's nested one level
deeper in this folder (another runner's sandbox folder inside this one).

After a reboot only images remain, unmounted: the sweep deletes them, except an image
kept on purpose (``keep_sandbox``), the negative control.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.subjects import Topology
from services.localenv.disk import IMAGE_NAME, MOUNT_NAME, sweep_stale
from tests.support.api_client import examples_api
from tests.support.disk_agent import IMPORT_PATH, disk_writer_manifest
from tests.support.importer_process import until
from tests.support.runner_policy import StartRunner, start_runner, write_policy
from tests.support.sandbox_env import needs_sandbox

pytestmark = [pytest.mark.integration, needs_sandbox]

MANIFEST = disk_writer_manifest("stale-disk", sleeper={"megabytes": 8, "sleep_s": 600})
REPO = Path(__file__).resolve().parents[2]
_DISK = """
import logging, os, sys, time
from pathlib import Path
from services.localenv.disk import TrialDisk
disk = TrialDisk.create(Path(sys.argv[1]), 32 << 20, logging.getLogger())
assert disk is not None
print("ready", flush=True)
if sys.argv[2] == "live":
    time.sleep(3600)  # holds the trial's lock until killed
os._exit(0)  # dead: nothing released
"""


def _mountinfo_points() -> set[Path]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return {Path(line.split(" ")[4].replace("\\040", " ")) for line in lines}


LOOP_CLEAR_S = 30.0
"""How long a released loop device may take to leave `losetup -a`."""


def _loop_devices_of(image: Path) -> list[str]:
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if f"({image}" in line]


def _loop_devices_left(image: Path, timeout_s: float = LOOP_CLEAR_S) -> list[str]:
    """The loop devices still bound under ``image`` once they had ``timeout_s`` to go:
    the kernel detaches an autoclear device after its last user closes it, not at once
    when the file system on it is unmounted."""
    deadline = time.monotonic() + timeout_s
    while (left := _loop_devices_of(image)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _disk_of(root: Path, *, live: bool) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _DISK, str(root), "live" if live else "dead"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    if not live:
        assert proc.wait(timeout=30) == 0
    return proc


@pytest.fixture
def controls(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """The disks the new runner must leave alone; released (and checked) at teardown."""
    roots = {
        "live": tmp_path / "sandboxes" / "live-trial",
        "elsewhere": tmp_path / "other-sandboxes" / "dead-trial",
        "nested": tmp_path / "sandboxes" / "inner-runner" / "dead-trial",
    }
    live = _disk_of(roots["live"], live=True)
    _disk_of(roots["elsewhere"], live=False)
    _disk_of(roots["nested"], live=False)
    try:
        yield roots
    finally:
        live.kill()
        live.wait(timeout=10)
        logger = logging.getLogger("test")
        for folder in ("sandboxes", "other-sandboxes", "sandboxes/inner-runner"):
            sweep_stale(tmp_path / folder, logger)
        left = _loop_devices_left(tmp_path)
        assert left == [], f"loop devices left behind: {left}"


async def test_a_restarted_runner_releases_the_disks_a_killed_one_left(
    tmp_path: Path,
    policy_runner: StartRunner,
    controls: dict[str, Path],
    nats_url: str,
    ledger_url: str,
    ledger_db: str,
    topology: Topology,
) -> None:
    sandboxes = tmp_path / "sandboxes"
    policy = write_policy(tmp_path / "policy", agent_import_paths=[IMPORT_PATH])
    first = policy_runner(policy, "doomed-runner", TRIALBUS_SANDBOX_DISK_MB="64")
    async with examples_api(
        nats_url, ledger_url, ledger_db, topology.prefix, check_runners=False
    ) as c:
        answer = await c.post(
            "/experiments", content=MANIFEST, headers={"Content-Type": "application/yaml"}
        )
    assert answer.status_code == 202, answer.text
    known = {controls["live"], controls["nested"].parent}
    trial_disks: list[Path] = []

    async def trial_disk_mounted() -> bool:
        trial_disks[:] = [
            p
            for p in _mountinfo_points()
            if p.name == MOUNT_NAME and p.parent.parent == sandboxes and p.parent not in known
        ]
        return bool(trial_disks)

    await until("the trial's disk to be mounted", trial_disk_mounted, first, 300)
    (mount_point,) = trial_disks
    image = mount_point.parent / IMAGE_NAME
    first.kill()  # SIGKILL to the runner's whole process group

    # What a killed runner leaves: the mount, its loop device, the image.
    assert mount_point in _mountinfo_points()
    assert _loop_devices_of(image), "the dead trial's loop device should still be bound"
    assert image.exists()

    second = start_runner(
        tmp_path / "second",
        policy,
        runner_id="next-runner",
        nats_url=nats_url,
        ledger_url=ledger_url,
        prefix=topology.prefix,
        TRIALBUS_SANDBOX_DIR=str(sandboxes),
        TRIALBUS_POOL="idle",  # takes no work: the release is the start's doing
    )
    try:

        async def released() -> bool:
            return "released disks of dead trials" in second.log_path.read_text()

        await until("the new runner's release", released, second, 120)
        log = second.log_path.read_text()
        assert str(mount_point.parent) in log  # named in the runner's log
        assert mount_point not in _mountinfo_points()
        assert _loop_devices_left(image) == []
        assert not image.exists()
        # Negative controls: not this folder's dead trials, so untouched.
        points = _mountinfo_points()
        for name, root in controls.items():
            assert root / MOUNT_NAME in points, f"the {name} control's disk was released"
            assert _loop_devices_of(root / IMAGE_NAME), f"the {name} control lost its device"
            assert str(root) not in log
    finally:
        second.stop()


def test_images_left_unmounted_are_deleted_unless_kept(tmp_path: Path) -> None:
    # After a reboot nothing is mounted: only the images of dead trials remain.
    scratch, logger = tmp_path / "sandboxes", logging.getLogger("test")
    rebooted, kept = scratch / "rebooted", scratch / "kept"
    for root in (rebooted, kept):
        _disk_of(root, live=False)
    for root in (rebooted, kept):
        subprocess.run(["umount", str(root / MOUNT_NAME)], check=True)
    (kept / "disk.kept").touch()  # what keep_sandbox leaves beside its image
    assert sweep_stale(scratch, logger) == [rebooted]
    assert not (rebooted / IMAGE_NAME).exists()
    # Negative control: the image kept on purpose stays.
    assert (kept / IMAGE_NAME).exists()
    assert _loop_devices_left(tmp_path) == []
