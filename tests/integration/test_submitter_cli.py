"""The submitter's CLI commands against the real nats-server and ledger.

``trialbus import`` with NATS reachable announces every record it writes
(ResultImported, like the importer service); with NATS unreachable it still ledgers
them and says it announced nothing. ``submit --json`` and ``import`` print what the
README documents."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from infra.managed_process import free_port
from schemas.events import ResultImported, parse_event
from schemas.subjects import Topology
from services.common.settings import CommonSettings
from services.submitter.commands import import_job
from services.submitter.connections import refused_throughout
from tests.e2e.cli import run_module
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRIALS = ("trial-a", "trial-b")


def _job(tmp_path: Path, name: str) -> Path:
    """A job folder of unfinished trials (a trial.log each): partial records, no Harbor run."""
    job = tmp_path / name
    for trial in TRIALS:
        (job / trial).mkdir(parents=True)
        (job / trial / "trial.log").write_text("started\n")
    return job


async def _announced(servers: Servers, experiment_id: str) -> list[str]:
    """trial_ids of the ResultImported events the stream holds for the experiment."""
    topology = servers.topology
    nc = await nats.connect(servers.nats_url)
    try:
        js = nc.jetstream()
        subject = topology.event_subject("result_imported", experiment_id)
        info = await js.stream_info(topology.events_stream, subjects_filter=subject)
        n = sum((info.state.subjects or {}).values())
        if n == 0:
            return []
        sub = await js.subscribe(subject, ordered_consumer=True)
        trial_ids = []
        for _ in range(n):
            event = parse_event((await sub.next_msg(timeout=10)).data)
            assert isinstance(event, ResultImported)
            trial_ids.append(event.trial_id)
        return sorted(trial_ids)
    finally:
        await nc.close()


async def _ledgered(servers: Servers, experiment_id: str) -> list[str]:
    ledger = servers.ledger()
    try:
        return sorted(r.trial_id for r in await ledger.records_for(experiment_id))
    finally:
        await ledger.close()


async def test_import_announces_its_records_when_nats_is_reachable(
    servers: Servers, tmp_path: Path
) -> None:
    settings = servers.settings(CommonSettings)
    summary = await import_job(settings, _job(tmp_path, "by-hand"))

    assert (summary["announced"], summary["total"], summary["partial"]) == (True, 2, 2)
    experiment_id = summary["experiment_id"]
    assert await _ledgered(servers, experiment_id) == list(TRIALS)
    assert await _announced(servers, experiment_id) == list(TRIALS)


async def test_import_without_nats_ledgers_and_says_it_announced_nothing(
    servers: Servers, topology: Topology, tmp_path: Path
) -> None:
    settings = servers.settings(CommonSettings).model_copy(
        update={"nats_url": f"nats://127.0.0.1:{free_port()}"}
    )
    summary = await import_job(settings, _job(tmp_path, "offline"))

    assert (summary["announced"], summary["total"]) == (False, 2)
    experiment_id = summary["experiment_id"]
    assert await _ledgered(servers, experiment_id) == list(TRIALS)
    # The control: the real server holds no announcement of it (no stream was even made).
    nc = await nats.connect(servers.nats_url)
    try:
        streams = [s.config.name for s in await nc.jetstream().streams_info()]
    finally:
        await nc.close()
    assert topology.events_stream not in streams


async def test_the_cli_submits_and_imports_with_its_documented_output(
    servers: Servers, ledger_db: str, tmp_path: Path
) -> None:
    env = servers.cli().env
    # Its own database: the two job folders hold the same trial names, and a ledger
    # refuses to move a trial to another experiment (test_ledger_boundary).
    offline = {
        **env,
        "NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "TRIALBUS_LEDGER_DB": f"{ledger_db}-offline",
    }
    manifest = str(REPO / "examples" / "experiment.yaml")
    # No runner runs here: with the live-runner check on, the submission is refused
    # naming the pool; with it off it is queued for runners that start later.
    refused = await asyncio.to_thread(run_module, env, "submit", manifest, "--json")
    assert refused.returncode == 2, refused.stderr
    assert "compute: no live runner in pool 'default'; no runner is live" in refused.stderr
    queue_only = {**env, "TRIALBUS_CHECK_RUNNERS": "false"}
    submitted, imported, unannounced = await asyncio.gather(
        asyncio.to_thread(run_module, queue_only, "submit", manifest, "--json"),
        asyncio.to_thread(run_module, env, "import", str(_job(tmp_path, "cli-json")), "--json"),
        asyncio.to_thread(run_module, offline, "import", str(_job(tmp_path, "cli-text"))),
    )

    assert submitted.returncode == 0, submitted.stderr
    summary = json.loads(submitted.stdout)
    assert (summary["n_trials"], summary["n_published"], summary["n_duplicates"]) == (24, 24, 0)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["announced"] is True
    assert unannounced.returncode == 0, unannounced.stderr
    assert unannounced.stdout == ""
    lines = unannounced.stderr.splitlines()
    assert lines[0] == "experiment harbor-cli-text: 2 trials: 2 imported, 0 unchanged, 2 partial"
    assert [line.split(":")[0] for line in lines[1:-1]] == [f"  {t}" for t in TRIALS]
    assert lines[-1] == "NATS unreachable: recorded in the ledger without ResultImported events"


async def test_a_dry_run_with_a_stack_is_checked_against_it_and_publishes_nothing(
    servers: Servers,
) -> None:
    env = servers.cli().env
    manifest = str(REPO / "examples" / "experiment.yaml")
    # No runner is live: refused as the submission is, not "manifest ok".
    refused = await asyncio.to_thread(run_module, env, "submit", manifest, "--dry-run")
    assert refused.returncode == 2, refused.stderr
    assert "compute: no live runner in pool 'default'" in refused.stderr
    # The control: with the live-runner check off, the plan, checked against the stack.
    queue_only = {**env, "TRIALBUS_CHECK_RUNNERS": "false"}
    planned = await asyncio.to_thread(
        run_module, queue_only, "submit", manifest, "--dry-run", "--json"
    )
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert (plan["stack"], plan["n_trials"]) == (True, 24)
    assert "the live runners (TRIALBUS_CHECK_RUNNERS is off)" in plan["not_checked"]
    nc = await nats.connect(servers.nats_url)
    try:
        js, work = nc.jetstream(), servers.topology.work_stream
        if work in [s.config.name for s in await js.streams_info()]:
            assert (await js.stream_info(work)).state.messages == 0  # nothing published
    finally:
        await nc.close()


async def test_a_read_with_no_ledger_says_where_it_looked_and_how_to_start_one(
    servers: Servers,
) -> None:
    port = free_port()
    env = {**servers.cli().env, "LEDGER_URL": f"mongodb://127.0.0.1:{port}"}
    proc = await asyncio.to_thread(run_module, env, "leaderboard")
    assert proc.returncode == 3, proc.stderr  # EXIT_UNAVAILABLE
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"unavailable: ledger unreachable during experiment_ids: 127.0.0.1:{port}:"
    )
    assert line.endswith(
        "start the embedded stack with `trialbus up` (or `make up`), or set LEDGER_URL"
    )
    assert "Topology Description" not in line


async def test_a_command_with_nothing_listening_at_nats_says_so_without_waiting_it_out(
    servers: Servers,
) -> None:
    port = free_port()
    env = {**servers.cli().env, "NATS_URL": f"nats://127.0.0.1:{port}"}
    proc = await asyncio.to_thread(
        run_module, env, "submit", str(REPO / "examples/experiment.yaml")
    )
    assert proc.returncode == 3, proc.stderr  # EXIT_UNAVAILABLE
    # The refused-connection answer, not nats-py's 10 s connect timeout running out.
    assert (
        f"cannot reach NATS at nats://127.0.0.1:{port} (connection refused: nothing listens "
        "there): start the embedded stack with `trialbus up`"
    ) in proc.stderr


async def test_a_server_that_starts_listening_within_the_window_is_waited_for() -> None:
    # A nats-server restarting under `trialbus up` refuses for about a second: a command
    # started then must connect, not give up.
    port = free_port()
    url = [f"nats://127.0.0.1:{port}"]
    assert await refused_throughout(url, 0.5)  # control: nothing ever listens
    listening: list[asyncio.Server] = []

    async def start_late() -> None:
        await asyncio.sleep(0.5)
        listening.append(await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port))

    late = asyncio.create_task(start_late())
    try:
        assert not await refused_throughout(url, 30)
    finally:
        await late
        for server in listening:
            server.close()


def test_an_error_is_printed_as_written_not_read_as_rich_markup(tmp_path: Path) -> None:
    # The console reads '[...]' as a style tag: the pattern's '[a-z0-9]' and the
    # value's '[bold]' vanished, leaving "experiment_id 'ab' must match ^{0,63}$".
    manifest = tmp_path / "bad-id.yaml"
    manifest.write_text(
        'name: x\nexperiment_id: "a[bold]b"\ntasks: [hello-file]\nagents:\n  - name: oracle\n'
    )
    proc = run_module({}, "submit", str(manifest))
    assert proc.returncode == 2, proc.stderr
    assert "experiment_id 'a[bold]b' must match ^[a-z0-9][a-z0-9_-]{0,63}$" in proc.stderr
