"""The example experiment with its runners on two other "hosts" that share no disk.

The hub (root namespaces: the stack's own authenticated nats-server bound to the
bridge, the ledger, submitter, importer, watcher) and two runner hosts, each in its own
network, mount and pid namespaces (tests/support/netns.py): a host reaches the hub only
through NATS on the bridge address, with the runner role's credentials copied onto its
own disk, and sees neither the hub's /tmp (where the submitted tasks are) nor the
checkout's example tasks (hidden). What this proves, from the system's own records:

1. the ledger is exactly the single-machine run's (same experiment and trial ids, the
   outcome of tests/e2e/test_pipeline.py's EXPECTED for every trial);
2. both hosts ran trials (records' provenance.runner_host);
3. killing a host (every process of it, its disk) while it runs trials loses nothing:
   its unfinished trials run again on the other host, every trial gets one record,
   and the fault checker (tests/e2e/ledger_check.py) agrees;
4. nothing a runner wrote is on the hub's disk, the hosts fetched the tasks from the
   tasks bucket into their own caches, and the importer's job folder holds every
   trial's result.json, which came through the results bucket.

The ``multi-host:`` line gives the figures (trials, hosts, bytes through the buckets,
wall time). Needs root and iproute2/util-linux: under CI=true their absence fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
import yaml
from nats.js.errors import KeyNotFoundError

from infra.embedded import NatsServer
from infra.embedded_stack import EmbeddedStack
from infra.nats_auth import connect_as, load_credentials
from schemas.events import Event, TrialCompleted, TrialFailed, TrialStarted
from schemas.manifest import ExperimentManifest
from schemas.subjects import Topology
from services.submitter.submit import experiment_id_of
from tests.conftest import skip_unless
from tests.e2e.conftest import Stacks
from tests.e2e.events import EventTap, read_events
from tests.e2e.faultkit import expected_trial_ids, judge, ledger_records, submit
from tests.e2e.test_pipeline import MANIFEST, assert_example_outcomes
from tests.support.netns import HOST_DATA_DIR, Host, HostProcess, Hosts, unavailable_reason

pytestmark = pytest.mark.e2e

REPO_TASKS = MANIFEST.parent / "tasks"
"""The checkout's example tasks: hidden inside the hosts."""

CONCURRENCY = 2
"""Trial slots per host: 4 in all, as the single-machine pipeline test has."""
ACK_WAIT_S = 10
"""The runners' ack_wait: how soon a dead host's trials are handed to another."""
DEADLINE_S = 120.0
"""Bound on each wait (an event ends it; this only names what never happened)."""


def runner_env(stack: EmbeddedStack, host: Host) -> dict[str, str]:
    """A runner's whole environment on ``host``: a NATS URL, credentials, its own disk."""
    data = Path(HOST_DATA_DIR)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRIALBUS_") and k not in {"NATS_URL", "LEDGER_URL"}
    }
    env.update(
        {
            "NATS_URL": stack.nats_url or "",
            "TRIALBUS_NATS_CREDENTIALS": str(data / "runner.json"),
            "TRIALBUS_PREFIX": stack.prefix,
            "TRIALBUS_RUNNER_ID": f"{host.name}-runner",
            "TRIALBUS_CONCURRENCY": str(CONCURRENCY),
            "TRIALBUS_WORK_DIR": str(data / "work"),
            "TRIALBUS_SANDBOX_DIR": str(data / "sandboxes"),
            "TRIALBUS_ACK_WAIT_S": str(ACK_WAIT_S),
            "TRIALBUS_HEARTBEAT_S": "1",
            "TRIALBUS_LOG_JSON": "true",
            # Harbor and Python caches land on the host's disk, not the hub's /root.
            "HOME": str(data / "home"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


def start_runner(stack: EmbeddedStack, host: Host) -> HostProcess:
    """Copy the runner role's credentials onto ``host``'s disk and start a runner there."""
    creds = stack.nats_credentials("runner")
    assert creds is not None, "the stack's nats-server must run with users"
    target = host.path(HOST_DATA_DIR) / "runner.json"
    target.write_bytes(creds.read_bytes())
    target.chmod(0o600)
    argv = [sys.executable, "-m", "services.runner"]
    return host.spawn(argv, runner_env(stack, host), label="runner")


def connected_ips(stack: EmbeddedStack) -> set[str]:
    """Client addresses connected to the stack's nats-server now (its monitor's /connz)."""
    server = next(c for c in stack.children() if isinstance(c, NatsServer))
    with urllib.request.urlopen(f"{server.monitor_url}/connz", timeout=5) as resp:
        return {c["ip"] for c in json.load(resp).get("connections") or []}


def copy_example(dest: Path) -> Path:
    """The example manifest and its tasks in ``dest`` (the hub's /tmp: hosts cannot see it)."""
    shutil.copytree(REPO_TASKS, dest / "tasks")
    shutil.copy2(MANIFEST, dest / MANIFEST.name)
    return dest / MANIFEST.name


def open_runs(events: Sequence[Event], experiment_id: str, host: str) -> dict[str, str]:
    """Runs started on ``host`` whose attempt has no ending event yet: run key -> trial."""
    started, ended = {}, set()
    for e in events:
        if e.experiment_id != experiment_id:
            continue
        if isinstance(e, TrialStarted) and e.host == host:
            started[(e.run_id or e.trial_id, e.attempt)] = e.trial_id
        elif isinstance(e, TrialCompleted | TrialFailed):
            ended.add((e.run_id or e.trial_id, e.attempt))
    return {key[0]: tid for key, tid in started.items() if key not in ended}


def in_flight(events: Sequence[Event], experiment_id: str, host: str) -> set[str]:
    """Trials of runs started on ``host`` that have not ended (completed or failed) yet."""
    return set(open_runs(events, experiment_id, host).values())


async def endings_stored(stack: EmbeddedStack, topo: Topology, run_keys: Sequence[str]) -> int:
    """How many of these runs have their ending stored in the control bucket: a runner
    stores it before it publishes it, so such a run is over even if no event says so."""
    creds = stack.nats_credentials("admin")
    assert creds is not None
    nc = await connect_as([stack.nats_url or ""], load_credentials(creds, "admin"), name="e2e")
    try:
        control = await nc.jetstream().key_value(topo.control_bucket)
        n = 0
        for key in run_keys:
            with contextlib.suppress(KeyNotFoundError):
                await control.get(f"runs.{key.replace(':', '=')}.ended")
                n += 1
        return n
    finally:
        await nc.close()


async def buckets(stack: EmbeddedStack, topo: Topology) -> tuple[dict[str, int], set[str]]:
    """Bytes held by the tasks and results buckets' streams (``OBJ_<bucket>``), and the
    names (checksums) of the task archives stored."""
    creds = stack.nats_credentials("admin")
    assert creds is not None
    nc = await connect_as([stack.nats_url or ""], load_credentials(creds, "admin"), name="e2e")
    try:
        js = nc.jetstream()
        sizes = {
            b: (await js.stream_info(f"OBJ_{b}")).state.bytes
            for b in (topo.tasks_bucket, topo.results_bucket)
        }
        tasks = await js.object_store(topo.tasks_bucket)
        return sizes, {info.name for info in await tasks.list()}
    finally:
        await nc.close()


async def test_runners_on_two_hosts_without_shared_disk(
    stacks: Stacks, topology: Topology, tmp_path: Path
) -> None:
    skip_unless(unavailable_reason())
    manifest = copy_example(tmp_path / "examples")
    with Hosts(2, log_dir=tmp_path / "hosts", hidden=[str(REPO_TASKS)]) as hosts:
        stack = await stacks.start(
            nats_url=None,  # its own nats-server, with users, where the hosts reach it
            nats_host=hosts.hub_address,
            n_runners=0,
            runner_env={"TRIALBUS_ACK_WAIT_S": str(ACK_WAIT_S)},
        )
        admin = load_credentials(stack.nats_credentials("admin") or Path(), "admin")
        tap = EventTap(stack.nats_url or "", topology, admin)
        try:
            await tap.start()
            await scenario(stacks, stack, hosts, tap, manifest)
        finally:
            # The hub stops while the bridge still exists: once its address is gone,
            # each service's NATS connection waits out its timeouts on close (22 s).
            await tap.close()
            await asyncio.to_thread(stack.stop)
            stacks.made.remove(stack)


async def scenario(
    stacks: Stacks, stack: EmbeddedStack, hosts: Hosts, tap: EventTap, manifest: Path
) -> None:
    """Runners on both hosts, submit, kill host 0 while busy, then every check."""
    h0, h1 = hosts
    topology = tap.topology
    runners = [start_runner(stack, h) for h in hosts]

    async def both_connected() -> bool:
        for r in runners:
            assert r.running, r.output()
        return {h0.address, h1.address} <= await asyncio.to_thread(connected_ips, stack)

    await wait_for(both_connected, "both hosts' runners connected", DEADLINE_S)

    t0 = time.monotonic()
    cli = stacks.cli(stack, TRIALBUS_NATS_CREDENTIALS=str(stack.nats_credentials("submitter")))
    submitted = await submit(cli, manifest)
    exp = submitted.experiment_id
    # The single-machine run's experiment (and so trial) ids: same manifest.
    original = ExperimentManifest.model_validate(yaml.safe_load(MANIFEST.read_text()))
    assert exp == experiment_id_of(original)
    assert submitted.trial_ids == expected_trial_ids(MANIFEST, exp)
    assert len(submitted.trial_ids) == submitted.n_published == 24

    # 3. Kill host 0 once it has finished a trial and is running others.
    def busy_host0(events: Sequence[Event]) -> bool:
        for r in runners:
            assert r.running, r.output()
        done = any(isinstance(e, TrialCompleted) and e.runner_host == h0.name for e in events)
        return done and bool(in_flight(events, exp, h0.name))

    # Frozen first (SIGSTOP: it can publish nothing more), then judged from the stream
    # itself: killed only if a run it started is still open, else thawed and tried at
    # its next busy moment. A kill timed on the tap alone could fall between two trials.
    while True:
        await tap.eventually(busy_host0, f"{h0.name} busy", DEADLINE_S)
        assert len(tap.imported(exp)) < 24  # mid-experiment
        await asyncio.to_thread(signal_host, h0, signal.SIGSTOP)
        stored = await read_events(stack.nats_url or "", topology, tap.credentials)
        runs = open_runs(stored, exp, h0.name)
        # A run whose ending is stored but not yet published is over: the next delivery
        # re-publishes that ending, and nothing is left for host 1 to run.
        if runs and await endings_stored(stack, topology, list(runs)) < len(runs):
            break
        await asyncio.to_thread(signal_host, h0, signal.SIGCONT)

        # The count is bound as a default: a loop's closure would read a later value.
        def more_events(events: Sequence[Event], seen: int = len(stored)) -> bool:
            return len(events) > seen

        await tap.eventually(more_events, "more events after a thaw", DEADLINE_S)
    await asyncio.to_thread(h0.kill)
    killed_at = time.monotonic() - t0
    assert not h0.alive and runners[0].poll() is not None
    # The hub no longer sees the dead host (its connection went with it).
    await wait_for(lambda: h0.address not in connected_ips(stack), f"{h0.name} gone", DEADLINE_S)

    await tap.all_imported(exp, set(submitted.trial_ids), DEADLINE_S)
    wall_s = time.monotonic() - t0
    assert runners[1].running, runners[1].output()

    # 1. Exactly the single-machine ledger.
    records = {r.trial_id: r for r in await ledger_records(stack, exp)}
    assert set(records) == set(submitted.trial_ids)
    assert_example_outcomes(records.values())

    # 2. Both hosts ran trials; what host 0 left unfinished (the runs it started and
    # never ended, judged once everything is in), host 1 ran.
    interrupted = in_flight(tap.events, exp, h0.name)
    assert interrupted, "the kill interrupted no trial (it came between two)"
    by_host = {h.name: 0 for h in hosts}
    for rec in records.values():
        by_host[rec.provenance.runner_host or "?"] += 1
    assert set(by_host) == {h0.name, h1.name} and min(by_host.values()) > 0, by_host
    assert {records[t].provenance.runner_host for t in interrupted} == {h1.name}

    # 3. Nothing lost or doubled, judged from the events and the ledger.
    events = await read_events(stack.nats_url or "", topology, tap.credentials)
    check = await judge("multi-host: kill a runner host", stack, submitted, events=events)
    assert check.ok, check.explain()
    assert check.reruns >= len(interrupted)  # control: the kill did cost runs

    # 4. Every trial's result.json reached the hub's job folder through the bucket.
    jobs = stack.jobs_dir / exp
    assert all((jobs / t / "result.json").is_file() for t in records)
    result_refs = [r.artifacts.archive for r in records.values()]
    assert all(a is not None and a.bucket == topology.results_bucket for a in result_refs)
    assert all(Path(r.artifacts.trial_dir or "/").is_relative_to(jobs) for r in records.values())
    # Runners wrote only to their own disks: none of it is on the hub (where the data
    # folder is only the hosts' empty mount point) ...
    hub_data = Path(HOST_DATA_DIR)
    assert not hub_data.exists() or not any(hub_data.iterdir())
    # ... where the surviving host keeps the tasks it fetched (by checksum) ...
    moved, archives = await buckets(stack, topology)
    cache = h1.path(HOST_DATA_DIR) / "work" / "tasks"
    cached = {p.name for p in cache.iterdir() if not p.name.startswith(".")}
    assert cached and cached <= archives and len(archives) == 4, (cached, archives)
    # ... having never seen the task folders: hidden there, visible on the hub.
    assert h1.run(["ls", "-A", str(REPO_TASKS)]).stdout == ""
    assert h1.run(["test", "-e", str(manifest.parent / "tasks")]).returncode == 1
    assert (manifest.parent / "tasks").is_dir() and any(REPO_TASKS.iterdir())

    results_bytes = sum(a.size for a in result_refs if a is not None)
    print(
        f"multi-host: trials={len(records)} hosts=2 by_host={json.dumps(by_host)} "
        f"killed={h0.name} at_s={killed_at:.1f} interrupted={len(interrupted)} "
        f"reruns={check.reruns} result_archives_bytes={results_bytes} "
        f"tasks_stream_bytes={moved[topology.tasks_bucket]} "
        f"results_stream_bytes={moved[topology.results_bucket]} wall_s={wall_s:.1f}"
    )


def signal_host(host: Host, sig: signal.Signals) -> None:
    """Send ``sig`` to every process on ``host``'s network (the runner and its trials)."""
    for pid in host.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]], what: str, timeout_s: float
) -> None:
    """Poll ``condition()`` (sync or async) until true: for server states, not events."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = condition()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        await asyncio.sleep(0.2)  # polling interval: NATS monitor state has no event
