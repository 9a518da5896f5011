"""The submitter's HTTP API (in-process, via httpx's ASGI transport) against the real
nats-server and ledger: bearer-token checks, YAML and JSON bodies, and every bad
manifest of the corpus refused with a 422 that names the field (never a 500).

The boundary itself (Host, media types, body limit, auth before the body, owners,
start-up refusals) is tested against a uvicorn process in tests/security/test_http_api.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import nats
import pytest

from schemas.events import TrialStarted
from schemas.record import Evaluation, Provenance, TrialRecord
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import ExperimentInfo
from services.common.task_identity import task_checksum
from services.submitter.api_tokens import token_digest
from tests.bad_inputs.corpus import TASKS_ROOT, Case, cases, manifest_file
from tests.e2e.cli import run_module
from tests.support.live_runner import announce_live_runner
from tests.support.records import single_reward
from tests.support.servers import Servers
from tests.support.work_requests import work_messages

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TASKS = REPO / "examples" / "tasks"
TOKEN = "test-token-5d41402abc4b2a76"
GOOD_YAML = """\
name: http-api
tasks: [hello-file, count-words]
agents:
  - name: oracle
  - name: nop
repetitions: 2
"""
N_TRIALS = 2 * 2 * 2

Client = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    """A tokens file (0600) holding TOKEN's digest, for user ci of team tests."""
    path = tmp_path / "api-tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {token_digest(TOKEN)}, user: ci, team: tests}}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def client(servers: Servers, tokens_file: Path) -> Client:
    """Open a client on a submitter app (lifespan run: NATS and the ledger connected)."""

    @asynccontextmanager
    async def open_client(
        no_auth: bool = False, tasks_root: Path = EXAMPLE_TASKS, check_runners: bool = False
    ) -> AsyncIterator[httpx.AsyncClient]:
        async with servers.api(
            api_tokens_file=None if no_auth else tokens_file,
            api_no_auth=no_auth,
            tasks_root=tasks_root,
            # No runner runs in these tests: queue the work (one test turns it on).
            check_runners=check_runners,
        ) as c:
            yield c

    return open_client


async def _work_messages(nats_url: str, topology: Topology, experiment_id: str = "*") -> int:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(
            topology.work_stream, subjects_filter=topology.work_subject(experiment_id)
        )
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


async def _post_yaml(
    api: httpx.AsyncClient,
    text: str,
    authorization: str | None = f"Bearer {TOKEN}",
    *,
    dry_run: bool = False,
) -> httpx.Response:
    headers = {"Content-Type": "application/yaml"}
    if authorization is not None:
        headers["Authorization"] = authorization
    params = {"dry_run": "true"} if dry_run else None
    return await api.post("/experiments", content=text, headers=headers, params=params)


async def test_submit_requires_the_configured_token(
    client: Client, nats_url: str, topology: Topology
) -> None:
    async with client() as api:
        # Health checks stay open; everything else needs the token.
        assert (await api.get("/healthz")).status_code == 200
        refused = [
            await _post_yaml(api, GOOD_YAML, authorization=None),
            await _post_yaml(api, GOOD_YAML, authorization="Bearer wrong"),
            await _post_yaml(api, GOOD_YAML, authorization=TOKEN),  # no scheme
            await _post_yaml(api, GOOD_YAML, authorization=f"Basic {TOKEN}"),
            await _post_yaml(api, GOOD_YAML, authorization=f"Bearer {TOKEN}x"),
            await _post_yaml(api, GOOD_YAML, authorization=f"Bearer {TOKEN[:-1]}"),
            await api.get("/experiments/anything/status"),
            await api.get("/experiments/anything/leaderboard"),
        ]
        for response in refused:
            assert response.status_code == 401, response.text
            assert response.headers["WWW-Authenticate"] == "Bearer"
        assert await _work_messages(nats_url, topology) == 0  # nothing was published

        accepted = await _post_yaml(api, GOOD_YAML)
        assert accepted.status_code == 202, accepted.text
        body = accepted.json()
        assert (body["n_trials"], body["n_published"]) == (N_TRIALS, N_TRIALS)
        assert await _work_messages(nats_url, topology, body["experiment_id"]) == N_TRIALS

        # The same manifest as JSON names the same experiment; its trials dedupe.
        again = await api.post(
            "/experiments",
            json=_as_mapping(),
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert again.status_code == 202, again.text
        assert again.json()["experiment_id"] == body["experiment_id"]
        assert again.json()["n_duplicates"] == N_TRIALS
        assert await _work_messages(nats_url, topology) == N_TRIALS


def _as_mapping() -> dict[str, object]:
    return {
        "name": "http-api",
        "tasks": ["hello-file", "count-words"],
        "agents": [{"name": "oracle"}, {"name": "nop"}],
        "repetitions": 2,
    }


async def test_with_the_no_auth_setting_on_loopback_submit_is_open(
    client: Client, nats_url: str, topology: Topology
) -> None:
    async with client(no_auth=True) as api:
        response = await api.post("/experiments", json=_as_mapping())
        assert response.status_code == 202, response.text
        assert await _work_messages(nats_url, topology) == N_TRIALS


# Cases whose refusal is about reading a file, which an HTTP body does not have.
_FILE_ONLY = {"not-utf8"}


# Cases the API's body limit refuses before any parser sees them (413, not 422).
_TOO_LARGE = {"oversized"}


def _problems(case: Case, response: httpx.Response) -> list[str]:
    if case.name in _TOO_LARGE:
        if response.status_code == 413 and "larger than 1048576 bytes" in response.text:
            return []
        return [f"{case.name}: expected 413, got HTTP {response.status_code}: {response.text}"]
    if response.status_code != 422:
        return [f"{case.name}: HTTP {response.status_code}: {response.text[:300]}"]
    error: str = response.json()["error"]
    problems = [f"{case.name}: {f!r} not in {error!r}" for f in case.expect if f not in error]
    if case.spec.get("stage") != "resolve" and not error.startswith("request body: "):
        problems.append(f"{case.name}: does not name the body: {error!r}")
    problems += [f"{case.name}: echoes a secret" for s in case.spec.get("never", []) if s in error]
    return problems


async def test_every_bad_manifest_of_the_corpus_is_a_422_naming_the_field(
    client: Client, nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    # One app for the whole corpus (one case per request), problems collected per case.
    problems: list[str] = []
    async with client(tasks_root=TASKS_ROOT) as api:
        for case in cases("manifests"):
            if case.name not in _FILE_ONLY:
                text = manifest_file(case, tmp_path).read_text()
                problems += _problems(case, await _post_yaml(api, text))
    assert problems == []
    assert await _work_messages(nats_url, topology) == 0


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        pytest.param(
            json.dumps({**_as_mapping(), "repetitions": 0}),
            422,
            "request body: repetitions: Input should be greater than or equal to 1",
            id="field-out-of-range",
        ),
        pytest.param(
            json.dumps({**_as_mapping(), "agents": [{"name": "oracle", "envv": {}}]}),
            422,
            "request body: agents[0].envv: unknown field",
            id="unknown-field",
        ),
        pytest.param(
            json.dumps(_as_mapping())[:-1] + ', "agents": [{"name": "nop"}]}',
            422,
            "request body: key 'agents' is given twice in one object",
            id="duplicate-key",
        ),
        pytest.param(
            json.dumps({**_as_mapping(), "repetitions": True}),
            422,
            "request body: repetitions: Input should be a valid integer, got true, a boolean",
            id="boolean-count",
        ),
        pytest.param(json.dumps(["hello-file"]), 422, "must be a mapping", id="json-list"),
        pytest.param(
            "{not json",
            422,
            "request body: not valid JSON at line 1 column 2: Expecting property name",
            id="invalid-json",
        ),
        pytest.param("", 422, "request body: expected a manifest", id="empty-body"),
        pytest.param(
            '{"name": ' + "[" * 5000 + "]" * 5000 + "}",
            422,
            "request body: not valid JSON: nested too deeply",
            id="deep-json",
        ),
        pytest.param(
            '{"repetitions": ' + "9" * 5000 + "}",
            422,
            "request body: not valid JSON: Exceeds the limit (4300 digits)",
            id="huge-int",
        ),
    ],
)
async def test_bad_json_bodies_are_client_errors(
    client: Client, body: str, status: int, fragment: str
) -> None:
    async with client() as api:
        response = await api.post(
            "/experiments",
            content=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        )
    assert response.status_code == status, response.text
    assert fragment in response.text


def _records(experiment_id: str) -> list[TrialRecord]:
    """Two agents, three tasks, one unscored trial: enough for every figure to show."""
    out = []
    for agent, reward in (("oracle", 1.0), ("nop", 0.0)):
        for task in ("hello-file", "count-words", "multi-metric"):
            for rep in range(2):
                out.append(
                    TrialRecord(
                        trial_id=f"{experiment_id}-{agent}-{task}-{rep}",
                        experiment_id=experiment_id,
                        status="complete",
                        provenance=Provenance(task_name=task, agent_name=agent),
                        evaluation=single_reward(reward),
                    )
                )
    out[-1] = out[-1].model_copy(
        update={"evaluation": Evaluation(failure_class="verifier", reward_valid=False)}
    )
    return out


async def test_a_bad_query_parameter_is_a_422_naming_it_as_other_bad_input_is(
    client: Client,
) -> None:
    async with client() as api:
        maybe = await _post_yaml(api, GOOD_YAML, dry_run=False)  # the control: accepted
        assert maybe.status_code == 202, maybe.text
        bad = await api.post(
            "/experiments?dry_run=maybe",
            content=GOOD_YAML,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"},
        )
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"].startswith("query dry_run: Input should be a valid boolean")
        assert "(got 'maybe')" in bad.json()["error"]
        unnamed = await api.post("/tasks", content=archive(HELLO), headers=AUTH)
        assert unnamed.status_code == 422, unnamed.text
        assert unnamed.json() == {"error": "query name: Field required"}


async def test_a_posted_task_path_is_named_against_the_tasks_root_not_the_host(
    client: Client,
) -> None:
    # The client wrote its paths relative to the API's tasks root; where that lies on
    # the API's host is neither its business nor any help to it.
    async with client(tasks_root=EXAMPLE_TASKS) as api:
        text = GOOD_YAML.replace("[hello-file, count-words]", "[helo-file]")
        refused = await _post_yaml(api, text)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"] == (
            "tasks[0]: task folder <tasks root>/helo-file does not exist; "
            "did you mean 'hello-file'?"
        )
        assert str(EXAMPLE_TASKS.parent) not in refused.text


async def test_the_cli_and_the_http_api_read_the_same_numbers(
    client: Client, servers: Servers, topology: Topology, tmp_path: Path
) -> None:
    experiment_id = "one-read-path"
    ledger = servers.ledger()
    try:
        await ledger.ensure_indexes()
        await ledger.upsert_records(_records(experiment_id))
        await ledger.upsert_experiment(ExperimentInfo(experiment_id, "one read path", 13, {}))
    finally:
        await ledger.close()
    # Paused (its last trial waits): plain `status` and the API both say so.
    nc = await nats.connect(servers.nats_url)
    try:
        await (await NatsCoordinator.open(nc.jetstream(), topology, lease_ttl_s=60)).pause(
            experiment_id
        )
    finally:
        await nc.close()
    # COLUMNS out: the piped table's width is the CLI's own choice here.
    env = {k: v for k, v in servers.cli().env.items() if k != "COLUMNS"}
    page = tmp_path / "report.html"
    junit = tmp_path / "trials.xml"
    status, board, report, unknown, listed, table, trials, trials_table = await asyncio.gather(
        *(
            asyncio.to_thread(run_module, env, *args)
            for args in (
                ("status", experiment_id, "--json"),
                ("leaderboard", experiment_id, "--json"),
                ("report", experiment_id, "--json", "--html", str(page)),
                ("status", "no-such-experiment", "--json"),
                ("experiments", "--json"),
                ("experiments",),
                ("trials", experiment_id, "--json", "--unscored"),
                ("trials", experiment_id, "--agent", "nop", "--junit", str(junit)),
            )
        )
    )
    async with client() as api:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        base = f"/experiments/{experiment_id}"
        http = {p: await api.get(base + p, headers=auth) for p in ("/status", "/leaderboard")}
        http_report = await api.get(base + "/report", headers=auth)
        http_page = await api.get(base + "/report.html", headers=auth)
        missing = await api.get("/experiments/no-such-experiment/status", headers=auth)
        http_list = await api.get("/experiments", headers=auth)
        unauthenticated = await api.get("/experiments")
        http_trials = await api.get(base + "/trials", headers=auth)
        http_unscored = await api.get(base + "/trials?unscored=true", headers=auth)
        http_hello = await api.get(base + "/trials?task=hello-file&agent=oracle", headers=auth)
        http_junit = await api.get(base + "/trials.xml?agent=nop", headers=auth)

    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == http["/status"].json()
    assert http["/status"].json()["pending"] == 1  # 13 submitted, 12 recorded
    assert http["/status"].json()["paused"] is True
    assert json.loads(board.stdout) == http["/leaderboard"].json()
    assert [r["agent"] for r in http["/leaderboard"].json()] == ["oracle", "nop"]
    assert json.loads(report.stdout) == http_report.json()
    assert page.read_text(encoding="utf-8") == http_page.text
    # The list: the same rows, this test's experiment among them, paused, 12 of 13 done.
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == http_list.json()
    [mine] = [r for r in http_list.json() if r["experiment_id"] == experiment_id]
    assert (mine["name"], mine["state"], mine["done"], mine["total"]) == (
        "one read path",
        "paused",
        12,
        13,
    )
    assert unauthenticated.status_code == 401
    # The table, piped (not a terminal): ids whole, not cut to 80 columns' worth.
    assert table.returncode == 0, table.stderr
    assert f"│ {experiment_id} " in table.stdout, table.stdout
    # The trials: every record once, by task, agent and repetition; the unscored one
    # alone on request, the same from the CLI and over HTTP.
    every = http_trials.json()
    assert len(every) == 12 and len({t["trial_id"] for t in every}) == 12
    order = [(t["task"], t["agent"], t["repetition"] or 0, t["trial_id"]) for t in every]
    assert order == sorted(order)
    assert trials.returncode == 0, trials.stderr
    assert json.loads(trials.stdout) == http_unscored.json()
    [failed] = http_unscored.json()
    assert (failed["trial_id"], failed["scored"], failed["reward"], failed["failure_class"]) == (
        f"{experiment_id}-nop-multi-metric-1",
        False,
        None,
        "verifier",
    )
    assert [t["trial_id"] for t in http_hello.json()] == [
        f"{experiment_id}-oracle-hello-file-{rep}" for rep in range(2)
    ]
    assert trials_table.returncode == 0, trials_table.stderr
    assert "6 of 12 recorded trials" in trials_table.stdout, trials_table.stdout
    assert failed["trial_id"] in trials_table.stdout
    assert f"{experiment_id}-oracle-" not in trials_table.stdout  # the filter's control
    # The JUnit report of the same trials: nop's 5 wrong answers (reward 0) and its
    # unscored one; the same bytes over HTTP.
    assert http_junit.headers["content-type"] == "application/xml"
    assert junit.read_bytes() == http_junit.content
    suites = ET.fromstring(http_junit.content)
    counts = {k: suites.get(k) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "6", "failures": "5", "errors": "1", "skipped": "0"}
    props = suites.find("properties")
    assert props is not None
    facts = {p.get("name"): p.get("value") for p in props}
    assert facts == {"experiment_id": experiment_id, "trials": "13", "recorded": "12"}
    # An unknown experiment: exit 2 on the command line, 404 over HTTP, same words.
    assert unknown.returncode == 2
    assert "no experiment 'no-such-experiment' in the ledger" in unknown.stderr
    assert missing.status_code == 404
    assert missing.json() == {"detail": "no experiment 'no-such-experiment' in the ledger"}


async def test_a_trial_running_now_is_listed_first(
    client: Client, servers: Servers, topology: Topology
) -> None:
    """From its TrialStarted (the events stream), until its record arrives."""
    experiment_id = "listed-running"
    [done] = _records(experiment_id)[:1]
    running = f"{experiment_id}-running"
    ledger = servers.ledger()
    try:
        await ledger.upsert_records([done])
        await ledger.upsert_experiment(ExperimentInfo(experiment_id, "running", 2, {}))
    finally:
        await ledger.close()
    async with client() as api:  # its start provisions the streams
        nc = await nats.connect(servers.nats_url)
        try:
            await JetStreamBus(nc.jetstream(), topology).publish(
                TrialStarted(
                    experiment_id=experiment_id,
                    trial_id=running,
                    runner_id="r-1",
                    host="node-b",
                    attempt=2,
                    task_name="count-words",
                    agent_label="oracle",
                )
            )
        finally:
            await nc.close()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        listed = (await api.get(f"/experiments/{experiment_id}/trials", headers=auth)).json()
        junit = await api.get(f"/experiments/{experiment_id}/trials.xml", headers=auth)
    assert [(t["trial_id"], t["status"]) for t in listed] == [
        (running, "running"),
        (done.trial_id, "complete"),
    ]
    assert {k: listed[0][k] for k in ("task", "agent", "attempts", "runner_host")} == {
        "task": "count-words",
        "agent": "oracle",
        "attempts": 2,
        "runner_host": "node-b",
    }
    # A JUnit report holds finished trials only: the running one is no case (yet).
    assert ET.fromstring(junit.content).get("tests") == "1"


async def test_a_manifest_no_live_runner_can_run_is_a_422_until_one_is_live(
    client: Client, nats_url: str, topology: Topology
) -> None:
    """And a dry run (``?dry_run=true``) is checked as the submission is, answering
    with the plan and publishing nothing."""
    manifest = (
        (EXAMPLE_TASKS.parent / "experiment.yaml")
        .read_text()
        .replace("name: ", "name: pool-check-", 1)
    )
    async with client(check_runners=True, tasks_root=EXAMPLE_TASKS.parent) as api:
        refused = await _post_yaml(api, manifest)
        assert refused.status_code == 422, refused.text
        assert "no live runner in pool 'default'" in refused.json()["error"]
        dry = await _post_yaml(api, manifest, dry_run=True)
        assert dry.status_code == 422, dry.text  # refused as the submission is
        assert "no live runner in pool 'default'" in dry.json()["error"]
        assert await _work_messages(nats_url, topology) == 0
        # Negative control: a live runner of the pool (announced in the registry, as
        # a runner process does) lets the same manifest through.
        nc = await nats.connect(nats_url)
        try:
            await announce_live_runner(nc.jetstream(), topology, concurrency=1)
        finally:
            await nc.close()
        dry = await _post_yaml(api, manifest, dry_run=True)
        assert dry.status_code == 200, dry.text
        plan = dry.json()
        assert (plan["dry_run"], plan["n_trials"], plan["agents"]) == (True, 24, ["oracle", "nop"])
        assert "trials-per-day" in plan["not_checked"]
        assert await _work_messages(nats_url, topology) == 0
        assert await _events(nats_url, topology) == 0  # no ExperimentSubmitted either
        accepted = await _post_yaml(api, manifest)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["experiment_id"] == plan["experiment_id"]
        assert await _work_messages(nats_url, topology) == 24
        assert await _events(nats_url, topology) > 0


async def test_a_task_asking_for_an_allowlist_needs_a_runner_that_enforces_it(
    client: Client, nats_url: str, topology: Topology
) -> None:
    """Its trials require ``local.allowlist`` (a root runner's), from a folder and from a
    stored archive alike; a pool of runners that do not offer it refuses the manifest at
    submit, saying why, instead of every trial failing on a runner."""
    allow = REPO / "tests" / "fixtures" / "tasks" / "allowlist-network"
    folder_manifest = "name: allow-folder\ntasks: [allowlist-network, phase-network]\n" + (
        "agents: [{name: oracle}]\ncompute: {environment: local}\n"
    )
    nc = await nats.connect(nats_url)
    try:
        async with client(
            check_runners=True, tasks_root=REPO / "tests" / "fixtures" / "tasks"
        ) as api:
            await announce_live_runner(nc.jetstream(), topology, concurrency=1)  # offers local
            refused = await _post_yaml(api, folder_manifest, dry_run=True)
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"].startswith(
                "task 'allowlist-network' requires 'local.allowlist' (its task.toml asks for a "
                "network allowlist, which the local environment enforces only on a runner "
                "that runs as root), and no live runner in pool 'default' offers 'local' and "
                "'local.allowlist'; live pools: default (local) x1"
            ), refused.text
            # The control: a runner that enforces it is live; the same manifest passes.
            await announce_live_runner(
                nc.jetstream(),
                topology,
                concurrency=1,
                runner_id="r-root",
                capabilities=("local", "local.allowlist"),
            )
            plan = await _post_yaml(api, folder_manifest, dry_run=True)
            assert plan.status_code == 200, plan.text
            assert plan.json()["requires"] == ["local", "local.allowlist"]
            # A stored task: read from its archive, its trials carry it too.
            stored = await api.post(
                "/tasks?name=allowlist-network", content=archive(allow), headers=AUTH
            )
            assert stored.status_code == 201, stored.text
            manifest = {
                "name": "allow-stored",
                "tasks": [stored.json()],
                "agents": [{"name": "oracle"}],
                "compute": {"environment": "local"},
            }
            headers = {**AUTH, "Content-Type": "application/json"}
            submitted = await api.post("/experiments", json=manifest, headers=headers)
            assert submitted.status_code == 202, submitted.text
    finally:
        await nc.close()
    experiment_id = submitted.json()["experiment_id"]
    [request] = [
        r for r in await work_messages(nats_url, topology) if r.experiment_id == experiment_id
    ]
    assert request.task_requires == ["local.allowlist"]


async def _events(nats_url: str, topology: Topology) -> int:
    nc = await nats.connect(nats_url)
    try:
        return (await nc.jetstream().stream_info(topology.events_stream)).state.messages
    finally:
        await nc.close()


# -- POST /tasks (issue 10): a task folder uploaded as a gzipped tar, for CI with no
# checkout next to the API. Unpacking is a trust boundary: every unsafe entry is a 4xx
# naming it; the well-formed upload beside each one (the negative control) is accepted.

HELLO = EXAMPLE_TASKS / "hello-file"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/gzip"}


def archive(folder: Path, *extra: tarfile.TarInfo) -> bytes:
    """``tar czf - -C folder .`` as CI would make it, plus ``extra`` entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buf.getvalue()


def entry(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 1
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = size if kind == tarfile.REGTYPE else 0
    return info


async def test_an_uploaded_task_is_stored_by_checksum_and_a_manifest_runs_it(
    client: Client, nats_url: str, topology: Topology
) -> None:
    async with client() as api:
        answer = await api.post("/tasks?name=hello-file", content=archive(HELLO), headers=AUTH)
        assert answer.status_code == 201, answer.text
        # The same checksum a submission from a checkout records: one task, two doors.
        assert answer.json() == {"name": "hello-file", "checksum": task_checksum(HELLO)}
        manifest = {
            "name": "uploaded-task",
            "tasks": [answer.json()],
            "agents": [{"name": "oracle"}],
            "repetitions": 2,
        }
        submitted = await api.post(
            "/experiments", json=manifest, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert submitted.status_code == 202, submitted.text
        experiment_id = submitted.json()["experiment_id"]
        assert await _work_messages(nats_url, topology, experiment_id) == 2
        # Negative control: a checksum never uploaded is refused, naming the task.
        missing = {
            **manifest,
            "name": "not-uploaded",
            "tasks": [{"name": "x", "checksum": "0" * 64}],
        }
        for dry_run in (False, True):  # a dry run looks in the bucket too
            refused = await api.post(
                "/experiments",
                json=missing,
                headers={**AUTH, "Content-Type": "application/json"},
                params={"dry_run": str(dry_run).lower()},
            )
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert "task 'x' (000000000000...) is not in the tasks bucket" in error


async def test_a_task_given_by_checksum_is_read_like_a_folder(
    client: Client, nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    """Its task.toml's variables travel with its trials, and the local environment's
    refusal comes at submit (services/submitter/stored_tasks.py), as for a folder."""
    judged = tmp_path / "judged"
    shutil.copytree(HELLO, judged)
    toml = judged / "task.toml"
    toml.write_text(toml.read_text() + '\n[verifier.env]\nJUDGE = "${OPENAI_API_KEY}"\n')
    compose = tmp_path / "needs-compose"
    shutil.copytree(HELLO, compose)
    (compose / "environment" / "docker-compose.yaml").write_text("services: {main: {}}\n")
    json_auth = {**AUTH, "Content-Type": "application/json"}
    async with client() as api:
        stored = []
        for folder in (judged, compose):
            answer = await api.post(
                f"/tasks?name={folder.name}", content=archive(folder), headers=AUTH
            )
            assert answer.status_code == 201, answer.text
            stored.append(answer.json())

        def manifest(tasks: list[object], environment: str = "local") -> dict[str, object]:
            return {
                "name": f"stored-{environment}-{len(tasks)}",
                "tasks": tasks,
                "agents": [{"name": "oracle"}],
                "compute": {"environment": environment},
            }

        refused = await api.post(
            "/experiments", json=manifest(stored), headers=json_auth, params={"dry_run": "true"}
        )
        assert refused.status_code == 422, refused.text
        assert (
            f"  task 'needs-compose' (stored {stored[1]['checksum'][:12]}...): "
            "environment/docker-compose.yaml: a multi-container"
        ) in refused.json()["error"]
        # The control: the same stored tasks, for Docker, pass.
        plan = await api.post(
            "/experiments",
            json=manifest(stored, "docker"),
            headers=json_auth,
            params={"dry_run": "true"},
        )
        assert plan.status_code == 200, plan.text
        assert plan.json()["runner_variables"] == ["OPENAI_API_KEY"]
        submitted = await api.post("/experiments", json=manifest(stored[:1]), headers=json_auth)
        assert submitted.status_code == 202, submitted.text
    experiment_id = submitted.json()["experiment_id"]
    published = await work_messages(nats_url, topology)
    [request] = [r for r in published if r.experiment_id == experiment_id]
    assert request.task_variables == ["OPENAI_API_KEY"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (entry("/etc/evil"), "'/etc/evil': absolute path"),
        (entry("tests/../../evil"), "'tests/../../evil': '..' in the path"),
        (entry("escape", tarfile.SYMTYPE, "/etc/passwd"), "'escape'"),
        (entry("tests/up", tarfile.SYMTYPE, "../../outside"), "'tests/up'"),
        (entry("fifo", tarfile.FIFOTYPE), "'fifo'"),
        (entry("dev", tarfile.CHRTYPE), "'dev'"),
        (entry("hard", tarfile.LNKTYPE, "task.toml"), "'hard'"),
    ],
    ids=["absolute", "dotdot", "link-out", "link-up", "fifo", "device", "hardlink"],
)
async def test_an_unsafe_entry_is_refused_naming_it(
    client: Client, extra: tarfile.TarInfo, named: str
) -> None:
    async with client() as api:
        refused = await api.post("/tasks?name=evil", content=archive(HELLO, extra), headers=AUTH)
        assert refused.status_code == 422, refused.text
        assert named in refused.json()["error"], refused.json()
        # Negative control: the same task without that entry is accepted.
        fine = await api.post("/tasks?name=evil", content=archive(HELLO), headers=AUTH)
        assert fine.status_code == 201, fine.text


async def test_what_is_not_a_task_archive_is_a_client_error(client: Client, tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.md").write_text("no task here")
    bomb = tarfile.TarInfo("zeros")
    bomb.size = 300 * 1024 * 1024  # compresses ~1000:1
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.addfile(bomb, io.BytesIO(bytes(bomb.size)))
    async with client() as api:
        not_task = await api.post(
            "/tasks?name=notes", content=archive(tmp_path / "notes"), headers=AUTH
        )
        assert (
            not_task.status_code == 422 and "not a Harbor task folder" in not_task.json()["error"]
        )
        ratio = await api.post("/tasks?name=bomb", content=buf.getvalue(), headers=AUTH)
        assert ratio.status_code == 422, ratio.text
        bad_name = await api.post("/tasks?name=../x", content=archive(HELLO), headers=AUTH)
        assert bad_name.status_code == 422 and "must match" in bad_name.json()["error"]
        wrong_type = await api.post(
            "/tasks?name=hello-file",
            content=archive(HELLO),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert wrong_type.status_code == 415 and "gzipped tar" in wrong_type.json()["error"]
        unauthenticated = await api.post(
            "/tasks?name=hello-file",
            content=archive(HELLO),
            headers={"Content-Type": "application/gzip"},
        )
        assert unauthenticated.status_code == 401


async def test_the_task_body_limit_is_its_own(
    client: Client, nats_url: str, topology: Topology
) -> None:
    # A manifest's 1 MiB limit does not apply to a task; the task limit does.
    async with client() as api:
        big = bytes(2 * 1024 * 1024)
        too_big = await api.post(
            "/experiments", content=big, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert too_big.status_code == 413 and "TRIALBUS_API_MAX_BODY_BYTES" in too_big.text
        task_sized = await api.post("/tasks?name=hello-file", content=big, headers=AUTH)
        assert task_sized.status_code == 422  # read in full, then refused as not a tar.gz
