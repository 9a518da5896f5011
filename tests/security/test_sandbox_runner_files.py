"""A trial or a build never sees the runner's own files, nor the host's processes.

A trial's sandbox shows the host's /usr, /etc and /var (lower layers of its
overlays) and the sources of its binds. A runner whose data folder lies there (the
FHS place for a service's state is /var/lib) showed it to every trial: measured
before the fix, a trial's ``cat`` printed the runner's NATS credentials file (0600,
root's: root inside is host uid 0), the ledger's files, another trial's agent
folder and the task cache. Paths given as ``hidden_paths`` (the runner gives its own,
``RunnerSettings.hidden_from_trials``) are now covered wherever they would show.

The runner's files are planted under /var/tmp (a real host folder under /var, removed
afterwards). Controls: the same files are read by the same probe in a sandbox told to
hide nothing (today's view before the fix), and a planted folder that is not hidden
is read beside the hidden ones.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.sandbox_env import EnvFactory, host_processes, needs_sandbox, running, sh

pytestmark = needs_sandbox


@dataclass(frozen=True)
class RunnerFiles:
    """A runner's files planted on the host, each holding ``token``."""

    root: Path
    token: str

    @property
    def credentials(self) -> Path:
        return self.root / "data" / "nats-auth" / "runner.creds"

    @property
    def ledger(self) -> Path:
        return self.root / "data" / "ledger"

    @property
    def work(self) -> Path:
        """The runner's work folder: other trials' folders, the task cache."""
        return self.root / "work"

    @property
    def visible(self) -> Path:
        """A folder nobody hides: the control."""
        return self.root / "visible"

    @property
    def hidden(self) -> list[str]:
        """What a runner with these files hides (a file and two folders)."""
        return [str(self.credentials), str(self.ledger), str(self.work)]

    def probe(self) -> str:
        """A command printing every planted file it can read (and why not, if not)."""
        return f"grep -r -s -l {self.token} {self.root}; cat {self.credentials} 2>&1; true"


@pytest.fixture
def runner_files() -> Iterator[RunnerFiles]:
    """The runner's files under /var/tmp, where a trial's /var overlay shows them."""
    root = Path("/var/tmp") / f"trialbus-sec-{uuid.uuid4().hex[:12]}"
    files = RunnerFiles(root, f"runner-file-{secrets.token_hex(8)}")
    planted = [
        files.credentials,
        files.ledger / "collection-0.wt",
        files.work / "jobs" / "other-exp" / "other-trial" / "agent" / "out.txt",
        files.work / "tasks" / ("a" * 64) / "solution" / "solve.sh",
        files.visible / "marker.txt",
    ]
    try:
        for path in planted:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{files.token}\n")
        yield files
    finally:
        shutil.rmtree(files.root, ignore_errors=True)


def _read(files: RunnerFiles, output: str) -> set[str]:
    """Names (relative to the planted root) of the planted files the probe read."""
    return {
        str(Path(line).relative_to(files.root))
        for line in output.splitlines()
        if line.startswith(f"{files.root}/")
    }


async def test_the_runners_files_are_hidden_from_a_trial(
    make_env: EnvFactory, runner_files: RunnerFiles
) -> None:
    files = runner_files
    # Control: told to hide nothing, the sandbox shows every planted file (the view
    # every trial had before the fix), so the probe can see them.
    async with running(make_env()) as open_trial:
        seen = await sh(open_trial, files.probe())
    assert _read(files, seen) == {
        "data/nats-auth/runner.creds",
        "data/ledger/collection-0.wt",
        "work/jobs/other-exp/other-trial/agent/out.txt",
        f"work/tasks/{'a' * 64}/solution/solve.sh",
        "visible/marker.txt",
    }, seen

    # Without the seccomp filter (which refuses nested user namespaces outright): the
    # covers must hold on their own, on a runner whose operator turned it off.
    trial = make_env(hidden_paths=files.hidden, seccomp=False)
    async with running(trial):
        seen = await sh(trial, files.probe())
        assert _read(files, seen) == {"visible/marker.txt"}, seen
        assert files.token not in seen.replace(f"{files.root}/visible/marker.txt", "")
        # Covered, not removed: the folders are empty, the file is empty, read-only.
        listing = await sh(trial, f"ls -A {files.ledger} {files.work}; wc -c <{files.credentials}")
        assert listing.split() == [f"{files.ledger}:", f"{files.work}:", "0"], listing
        for attempt in (
            f"umount {files.work}",
            f"umount -l {files.ledger}",
            # A nested user namespace holds CAP_SYS_ADMIN over its own mount namespace,
            # but the covers came in locked: they cannot be unmounted, and neither a
            # bind nor an overlay of the folder under them may leave them out.
            _nested(f"umount -l {files.work}; cat {files.work}/jobs/*/*/agent/out.txt"),
            _nested(f"mount --bind /var /mnt && grep -r {files.token} /mnt"),
            _nested(
                "mkdir -p /tmp/m && mount -t overlay overlay -o "
                f"lowerdir=/var/tmp:/opt/trialbus/bin /tmp/m && grep -r {files.token} /tmp/m"
            ),
            f"echo x > {files.credentials}",
            f"touch {files.work}/x",
            f"mv {files.ledger} /tmp/ledger && ls -A /tmp/ledger",
        ):
            done = await trial.exec(attempt)
            assert files.token not in (done.stdout or ""), (attempt, done.stdout)
        # Control: the nested namespace does hold the power those attempts needed.
        nested = await sh(trial, _nested("mount --bind /logs/agent /mnt && echo bound"))
        assert nested == "bound", nested
        assert await sh(trial, files.probe()) == seen
        # The trial's own folders stay its own: Harbor's log folders still work.
        await sh(trial, "echo mine > /logs/agent/mine.txt")
    assert (trial.trial_paths.agent_dir / "mine.txt").read_text() == "mine\n"
    assert files.credentials.read_text() == f"{files.token}\n"


async def test_a_build_step_does_not_see_the_runners_files(
    make_env: EnvFactory, runner_files: RunnerFiles
) -> None:
    files = runner_files
    dockerfile = f"FROM ubuntu:24.04\nRUN ({files.probe()}) > /seen.txt\n"
    trial = make_env(dockerfile, hidden_paths=files.hidden)
    async with running(trial):
        baked = await sh(trial, "cat /seen.txt")
    assert _read(files, baked) == {"visible/marker.txt"}, baked
    assert files.token not in baked.replace(f"{files.root}/visible/marker.txt", "")


async def test_host_processes_are_invisible_and_the_trials_own_are_visible(
    make_env: EnvFactory,
) -> None:
    """/proc in a trial is its own pid namespace's: no host process (the runner's
    environment and command line included) shows, a process of the trial does."""
    token = f"host-proc-{secrets.token_hex(8)}"
    host = await _host_process(token)
    try:
        await _shown_on_the_host(token)  # the host's own /proc shows it
        trial = make_env()
        async with running(trial):
            await sh(trial, f"(env TRIAL_MARK={token}-own sleep 300 >/dev/null 2>&1 &)")
            pids = (await sh(trial, "ls /proc | grep -E '^[0-9]+$'")).split()
            environs = await trial.exec(
                "for p in /proc/[0-9]*; do tr '\\0' '\\n' <$p/environ; tr '\\0' ' ' "
                "<$p/cmdline; echo; done 2>/dev/null"
            )
            direct = await trial.exec(f"cat /proc/{host.pid}/environ /proc/{os.getpid()}/environ")
    finally:
        os.killpg(host.pid, signal.SIGKILL)
        await host.wait()
    out = environs.stdout or ""
    # Control: the trial's own background process and its environment are there.
    assert f"TRIAL_MARK={token}-own" in out, out[:2000]
    assert f"HOST_MARK={token}" not in out and f"{token}-host-argv" not in out, out[:2000]
    # A handful of sandbox processes (bwrap's pid 1, its sleep, the probe), none of
    # the host's hundreds; the host pids named directly do not exist inside.
    assert len(pids) < 20, pids
    assert direct.return_code != 0 and token not in (direct.stdout or "")


async def _shown_on_the_host(token: str, within_s: float = 30.0) -> None:
    """Wait until the host's /proc shows a command line with ``token``. A process
    started by vfork (as subprocess does) is running before its command line is: the
    parent resumes once the child's new memory exists, before the loader fills in its
    arguments, so an early read can miss it: 29 of 1,500 asyncio starts here read it
    without its arguments right after the start; one such read failed this test in a
    fresh-clone run)."""
    deadline = time.monotonic() + within_s
    while not host_processes(token):
        assert time.monotonic() < deadline, f"no host process shows {token!r} in /proc"
        await asyncio.sleep(0.05)


async def _host_process(token: str) -> asyncio.subprocess.Process:
    """A host process with ``token`` in its environment and command line."""
    return await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        "sleep 300; :",  # sh stays, with the token as its $0
        f"{token}-host-argv",
        env={"PATH": "/usr/bin:/bin", "HOST_MARK": token},
        start_new_session=True,
    )


def _nested(command: str) -> str:
    """``command`` as root of a new user and mount namespace inside the trial."""
    return f"unshare --user --map-root-user --mount sh -c {shlex.quote(command)} 2>&1"
