"""The importer's reads of a trial folder (issue 11).

A trial writes its ``verifier/`` and ``agent/`` folders from inside its sandbox: a file
there may be a link to a host file, a FIFO, a device or endless. Against real files,
the real record builder and, end to end, the importer as its own process on the
session's nats-server and ledger: a linked file or folder is not read (the record says
why; the host file's content appears nowhere), a FIFO does not block, an oversized
file is refused. Each has its negative control: the same content as a regular file
IS read. Anything that could block runs in a thread with a timeout (reads_support).
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import nats
import pytest

from infra.service_process import ServiceProcess
from schemas.events import encode_event
from schemas.record import TrialRecord
from schemas.subjects import Topology
from services.common.folder_reads import MAX_FILE_BYTES, Unread, read_inside
from services.importer.records import RecordContext, build_record
from tests import harbor_fixtures
from tests.harbor_fixtures import HarborTrials
from tests.security import reads_support
from tests.security.reads_support import LIMIT_S, PLANTED, bounded, plant, release
from tests.support import importer_process
from tests.support.importer_process import until
from tests.support.servers import Servers
from tests.support.stored_results import completed_from

harbor_trials = harbor_fixtures.harbor_trials  # the session's real Harbor trial folders
importer = importer_process.importer  # the importer as its own process, ready
importer_env = importer_process.importer_env  # with no settings of this module's own
host = reads_support.host

CTX = RecordContext(experiment_id="exp", trial_id="t")
IMPORTER_WAIT_S = 90.0
"""Bound on the importer's recording every planted trial."""


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_link_to_a_host_file_or_folder_is_not_read(
    name: str, host: tuple[Path, str], harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    folder, token = host
    linked = bounded(
        lambda: build_record(plant(harbor_trials, tmp_path, name, folder, link=True), CTX)
    )
    assert PLANTED[name][1] in linked.errors
    assert token not in linked.model_dump_json()
    assert linked.status == "partial" and not linked.evaluation.reward_valid
    # Negative control: the same content as a regular file (or folder) is read.
    copied = build_record(plant(harbor_trials, tmp_path, name, folder, link=False), CTX)
    assert token in copied.model_dump_json()


@pytest.mark.parametrize("kind", ["FIFO", "socket", "device"])
def test_a_special_file_in_place_of_reward_txt_is_refused_without_blocking(
    kind: str, harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trial = harbor_trials.copy("oracle", tmp_path)
    (trial / "result.json").unlink()
    reward = trial / "verifier" / "reward.txt"
    reward.unlink()
    if kind == "FIFO":
        os.mkfifo(reward)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(reward))
        sock.close()
    else:
        if os.geteuid() != 0:
            pytest.skip("mknod of a device needs root")
        os.mknod(reward, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless
    record = bounded(lambda: build_record(trial, CTX), [reward])
    assert f"verifier/reward.txt: not a regular file (a {kind}); not read" in record.errors
    if kind == "FIFO":
        # Negative control: a plain open() of that FIFO does block (then is released).
        waiting = threading.Thread(target=lambda: open(reward, "rb").close(), daemon=True)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()
        release(reward)
        waiting.join(LIMIT_S)


@pytest.mark.parametrize("swap", ["FIFO", "link"])
def test_a_file_swapped_after_the_look_is_refused_by_what_was_opened(
    swap: str,
    host: tuple[Path, str],
    harbor_trials: HarborTrials,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, token = host
    trial = harbor_trials.copy("oracle", tmp_path)
    (trial / "result.json").unlink()
    reward = trial / "verifier" / "reward.txt"
    reward.write_text("0.25")
    real_stat = os.stat
    swapped: list[bool] = []

    def stat_then_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        # The trial's move, between the reader's look and its open (the race): the
        # first look at reward.txt sees a regular file, then it is replaced.
        looked = real_stat(path, *args, **kwargs)
        if not swapped and os.path.basename(os.fsdecode(path)) == "reward.txt":
            swapped.append(True)
            reward.unlink()
            if swap == "FIFO":
                os.mkfifo(reward)
            else:
                reward.symlink_to(folder / "secret.txt")
        return looked

    control = build_record(trial, CTX)  # negative control: unswapped, it is read
    assert control.evaluation.rewards == {"reward": 0.25}
    monkeypatch.setattr(os, "stat", stat_then_swap)
    record = bounded(lambda: build_record(trial, CTX), [reward])
    expected = "not a regular file (a FIFO); not read" if swap == "FIFO" else "a symbolic link"
    assert any(e.startswith(f"verifier/reward.txt: {expected}") for e in record.errors)
    assert swapped and record.evaluation.rewards == {}
    assert token not in record.model_dump_json()


def test_an_oversized_reward_file_is_refused_and_one_at_the_bound_is_read(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trials = {}
    for size in (MAX_FILE_BYTES, MAX_FILE_BYTES + 1):
        trial = trials[size] = harbor_trials.copy("oracle", tmp_path, f"size-{size}")
        (trial / "result.json").unlink()
        with (trial / "verifier" / "reward.txt").open("r+b") as fh:
            fh.truncate(size)  # sparse: NUL bytes, "not a number" once read
    over = build_record(trials[MAX_FILE_BYTES + 1], CTX)
    assert (
        f"verifier/reward.txt: {MAX_FILE_BYTES + 1} bytes exceeds the 16 MiB limit; not read"
        in over.errors
    )
    at_bound = build_record(trials[MAX_FILE_BYTES], CTX)  # negative control: read
    assert any(e.endswith("is not a number") for e in at_bound.errors), at_bound.errors


def test_a_file_growing_while_read_is_cut_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "out.txt").write_bytes(b"x" * 10)
    assert read_inside(tmp_path, "out.txt", 64) == b"x" * 10  # negative control
    real_fstat = os.fstat

    def fstat_then_grow(fd: int) -> os.stat_result:
        seen = real_fstat(fd)
        with (tmp_path / "out.txt").open("ab") as fh:
            fh.write(b"y" * 1000)  # the writer keeps going after the size was checked
        return seen

    monkeypatch.setattr(os, "fstat", fstat_then_grow)
    got = read_inside(tmp_path, "out.txt", 64)
    assert got == Unread("65 bytes exceeds the 64-byte limit; not read")


def test_paths_that_could_leave_the_folder_are_refused_by_the_helper(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("in")
    assert read_inside(tmp_path, "a/f") == b"in"  # negative control
    for bad in ("../a/f", "a/../a/f", "/a/f", "a//f", "./a/f"):
        with pytest.raises(ValueError, match="plain relative path"):
            read_inside(tmp_path, bad)


# -- end to end: the importer service, as its own process, on the real bus and ledger -----
# Folders reach the importer as a runner stores them (pack_trial: links and special
# files are left out and listed, never followed); the importer unpacks them with no
# links allowed and reads them with the checks above.


async def test_the_importer_process_reads_no_planted_file_and_never_stalls(
    importer: ServiceProcess,
    host: tuple[Path, str],
    harbor_trials: HarborTrials,
    servers: Servers,
    topology: Topology,
    tmp_path: Path,
) -> None:
    folder, token = host
    job = tmp_path / "job"
    job.mkdir()
    planted = {
        name: {link: plant(harbor_trials, job, name, folder, link=link) for link in (True, False)}
        for name in PLANTED
    }
    fifo = harbor_trials.copy("oracle", job, "reward-fifo")
    oversized = harbor_trials.copy("oracle", job, "reward-oversized")
    for trial in (fifo, oversized):
        (trial / "result.json").unlink()
        (trial / "verifier" / "reward.txt").unlink()
    os.mkfifo(fifo / "verifier" / "reward.txt")
    with (oversized / "verifier" / "reward.txt").open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    trials = [fifo, oversized, *(t for pair in planted.values() for t in pair.values())]

    nc = await nats.connect(servers.nats_url)
    ledger = servers.ledger()
    try:
        js = nc.jetstream()
        for trial in trials:
            event = await completed_from(js, topology, "reads", trial)
            await js.publish(
                topology.event_subject("trial_completed", "reads"), encode_event(event)
            )

        async def all_recorded() -> bool:
            return await ledger.count_records("reads") == len(trials)

        # A reader blocked on the FIFO would never get here: the wait fails, not hangs.
        await until("a record of every trial", all_recorded, importer, IMPORTER_WAIT_S)
        records = {r.trial_id: r for r in await ledger.records_for("reads")}
    finally:
        await ledger.close()
        await nc.close()

    def left_out(record: TrialRecord, entry: str) -> bool:
        return any(f"{entry} (symbolic link (not followed))" in e for e in record.errors) or any(
            f"{entry} (FIFO (not followed))" in e for e in record.errors
        )

    for name in PLANTED:
        linked, copied = records[planted[name][True].name], records[planted[name][False].name]
        assert left_out(linked, name) and token not in linked.model_dump_json(), name
        assert token in copied.model_dump_json(), name  # negative control: read
        assert not left_out(copied, name), name
    assert left_out(records["reward-fifo"], "verifier/reward.txt")
    assert (
        f"verifier/reward.txt: {MAX_FILE_BYTES + 1} bytes exceeds the 16 MiB limit; not read"
        in records["reward-oversized"].errors
    )
    assert importer.alive
