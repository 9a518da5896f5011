"""The HTTP API boundary (API client, anyone on the network, a web page in a browser),
against the real service: ``python -m services.submitter`` under uvicorn on a free
loopback port, with the session's nats-server and ledger (and the importer process
where the ledger must learn of a submission).

Each test fails on the API as it was before issue 11 (open by default, text/plain
accepted, no Host check, body read before the token, no size limit, YAML parsed on the
event loop, no owner) and has a negative control: the same request done right is
accepted, so a refusal is never just a broken setup.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from infra.embedded import free_port
from schemas.subjects import Topology
from services.common.adapters.nats_kv import NatsCoordinator
from tests.security.http_api_support import (
    REPO,
    ApiProcess,
    chunked,
    head_then_body,
    random_tokens,
    raw_request,
    run_to_exit,
    service_env,
    start_service,
    wait_healthy,
    work_messages,
    write_tokens_file,
    zeros,
)
from tests.support.records import passed_record
from tests.support.servers import Servers
from tests.support.task_registry import served_file, task_registry

pytestmark = pytest.mark.integration

TOKENS = random_tokens(
    alice={"user": "alice", "team": "red"},
    bob={"user": "bob", "team": "blue"},
    ops={"user": "ops", "admin": True},
)
MIB = 1024 * 1024
MANIFEST = {"name": "http-security", "tasks": ["hello-file"], "agents": [{"name": "oracle"}]}
MANIFEST_YAML = "name: http-security\ntasks: [hello-file]\nagents: [{name: oracle}]\n"

StartApi = Callable[..., ApiProcess]
EXAMPLE_TASKS = REPO / "examples" / "tasks"
TRIALBUS = Path(sys.executable).with_name("trialbus")


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who][0]}"}


@pytest.fixture
def base_env(nats_url: str, ledger_url: str, topology: Topology, ledger_db: str) -> dict[str, str]:
    """Settings every process of a test shares (its own streams and database)."""
    return {
        "NATS_URL": nats_url,
        "LEDGER_URL": ledger_url,
        "TRIALBUS_LEDGER_DB": ledger_db,
        "TRIALBUS_PREFIX": topology.prefix,
        "TRIALBUS_TASKS_ROOT": str(REPO / "examples" / "tasks"),
        "TRIALBUS_LOG_JSON": "true",
    }


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    return write_tokens_file(tmp_path / "api-tokens.yaml", TOKENS)


@pytest.fixture
def start_api(base_env: dict[str, str], tokens_file: Path, tmp_path: Path) -> Iterator[StartApi]:
    """Start the API (tokens file by default; overrides replace or, as '', remove)."""
    started: list[ApiProcess] = []

    def start(**overrides: str) -> ApiProcess:
        port = free_port()
        settings = {
            "TRIALBUS_HTTP_HOST": "127.0.0.1",
            "TRIALBUS_HTTP_PORT": str(port),
            "TRIALBUS_API_TOKENS_FILE": str(tokens_file),
            **overrides,
        }
        env = service_env(base_env, **{k: v for k, v in settings.items() if v != ""})
        for name in [k for k, v in settings.items() if v == ""]:
            env.pop(name, None)  # removed, base_env's value included
        log_path = tmp_path / f"api-{port}.log"
        api = ApiProcess(start_service("services.submitter", env, log_path), port, log_path)
        started.append(api)
        wait_healthy(api)
        return api

    yield start
    for api in started:
        api.stop()


async def test_a_text_plain_manifest_is_refused(
    start_api: StartApi, nats_url: str, topology: Topology
) -> None:
    api = start_api()
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        plain = {"Content-Type": "text/plain"}
        # Reproduced before: this request, as any web page can send it, was a 202.
        anonymous = await c.post("/experiments", content=MANIFEST_YAML, headers=plain)
        assert anonymous.status_code == 401, anonymous.text
        with_token = await c.post(
            "/experiments", content=MANIFEST_YAML, headers={**plain, **auth("alice")}
        )
        assert with_token.status_code == 415, with_token.text
        assert "text/plain is not accepted" in with_token.json()["error"]
        untyped = await c.post("/experiments", content=MANIFEST_YAML, headers=auth("alice"))
        assert untyped.status_code == 415, untyped.text
        assert await work_messages(nats_url, topology) == 0
        # Control: the same manifest as YAML (both names) and as JSON is accepted.
        for media in ("application/yaml", "application/x-yaml; charset=utf-8"):
            r = await c.post(
                "/experiments",
                content=MANIFEST_YAML,
                headers={"Content-Type": media, **auth("alice")},
            )
            assert r.status_code == 202, r.text
        r = await c.post("/experiments", json=MANIFEST, headers=auth("alice"))
        assert r.status_code == 202, r.text
    assert await work_messages(nats_url, topology) == 1


async def test_every_route_of_the_api_asks_for_a_token(start_api: StartApi) -> None:
    """Each route the API documents (docs/openapi.json, kept current by `trialbus
    api-docs --check`), new ones included, answers 401 without a token: the guard is in
    front of every path but the health check, not declared route by route."""
    api = start_api()
    paths = json.loads((REPO / "docs" / "openapi.json").read_text())["paths"]
    not_refused = []
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        for path, operations in paths.items():
            url = path.replace("{experiment_id}", "no-such-exp").replace("{trial_id}", "t-1")
            for method in operations:
                answer = await c.request(method.upper(), url)
                if answer.status_code != 401:
                    not_refused.append(f"{method.upper()} {path}: {answer.status_code}")
        # Controls: the health check alone is open; with a token a route is reached.
        assert (await c.get("/healthz")).status_code == 200
        reached = await c.get("/experiments/no-such-exp/trials", headers=auth("alice"))
        assert reached.status_code == 404, reached.text
    assert not_refused == ["GET /healthz: 200"]
    assert len(paths) >= 19  # the documented routes were read


def _head(port: int, *extra: str) -> list[str]:
    return ["POST /experiments HTTP/1.1", f"Host: 127.0.0.1:{port}", *extra]


async def test_without_a_token_the_body_is_never_read(start_api: StartApi) -> None:
    api = start_api()
    rss_before = api.rss_kib()
    # A terabyte declared; up to 64 MiB offered while waiting for the answer.
    head = _head(api.port, "Content-Type: application/json", f"Content-Length: {2**40}")
    answer = await asyncio.to_thread(raw_request, api.port, head, zeros(64 * MIB))
    growth_kib = api.rss_kib() - rss_before
    assert answer.status == 401, (
        f"no 401 within 10 s after offering {answer.sent} body bytes (RSS +{growth_kib} KiB): "
        "the server reads the body before checking the token"
    )
    assert answer.closed, "the server kept the connection open to drain the body"
    assert growth_kib < 16 * 1024, f"the server's memory grew by {growth_kib} KiB"
    # Control: with a token, the server does wait for the body, then accepts it.
    body = json.dumps(MANIFEST).encode()
    head = _head(
        api.port,
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        f"Authorization: Bearer {TOKENS['alice'][0]}",
    )
    control = await asyncio.to_thread(head_then_body, api.port, head, body, 0.5)
    assert control.status == 202, control.body


async def test_an_oversized_body_is_refused_while_it_streams(
    start_api: StartApi, nats_url: str, topology: Topology
) -> None:
    api = start_api()
    text = json.dumps(MANIFEST)

    def padded(n: int) -> bytes:
        return (text + " " * (n - len(text))).encode()  # valid JSON of exactly n bytes

    token = f"Authorization: Bearer {TOKENS['alice'][0]}"
    json_type = "Content-Type: application/json"
    declared = await asyncio.to_thread(
        raw_request,
        api.port,
        _head(api.port, json_type, token, f"Content-Length: {MIB + 1}"),
        [padded(MIB + 1)],
    )
    assert declared.status == 413, declared.body
    assert b"request body larger than 1048576 bytes" in declared.body
    # No Content-Length: the limit holds while the body streams in, then the server hangs up.
    streamed = await asyncio.to_thread(
        raw_request,
        api.port,
        _head(api.port, json_type, token, "Transfer-Encoding: chunked"),
        chunked(padded(8 * MIB)),
    )
    assert streamed.status == 413, streamed.body
    assert b"request body larger than 1048576 bytes" in streamed.body
    assert streamed.closed
    assert await work_messages(nats_url, topology) == 0
    # Control: a body of exactly the limit is read and accepted.
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        at_limit = await c.post(
            "/experiments",
            content=padded(MIB),
            headers={"Content-Type": "application/json", **auth("alice")},
        )
    assert at_limit.status_code == 202, at_limit.text
    assert await work_messages(nats_url, topology) == 1


async def test_a_foreign_host_or_origin_is_refused(
    start_api: StartApi, nats_url: str, topology: Topology
) -> None:
    api = start_api()
    async with httpx.AsyncClient(base_url=api.base_url) as c:

        async def post(**headers: str) -> httpx.Response:
            return await c.post("/experiments", json=MANIFEST, headers={**auth("alice"), **headers})

        # A DNS-rebinding page: its own name now resolves to 127.0.0.1.
        for host in ("evil.example", f"evil.example:{api.port}", "localhost.evil.example"):
            refused = await post(Host=host)
            assert refused.status_code == 400, (host, refused.text)
        assert (await c.get("/healthz", headers={"Host": "evil.example"})).status_code == 400
        # A page on another origin posting straight to 127.0.0.1.
        for origin in ("http://evil.example", "null"):
            refused = await post(Origin=origin)
            assert refused.status_code == 403, (origin, refused.text)
        assert await work_messages(nats_url, topology) == 0
        # Controls: the API's own names, and a same-origin page.
        for host in (f"localhost:{api.port}", f"127.0.0.1:{api.port}"):
            assert (await post(Host=host)).status_code == 202
        assert (await post(Origin=f"http://localhost:{api.port}")).status_code == 202
    assert await work_messages(nats_url, topology) == 1


async def test_only_the_submitter_or_an_admin_may_cancel_pause_or_resubmit(
    start_api: StartApi,
    base_env: dict[str, str],
    servers: Servers,
    topology: Topology,
    tmp_path: Path,
) -> None:
    api = start_api()  # declares the streams the importer reads
    importer = start_service("services.importer", service_env(base_env), tmp_path / "imp.log")
    ledger = servers.ledger()
    nc = await nats.connect(servers.nats_url)
    try:
        coordinator = await NatsCoordinator.open(nc.jetstream(), topology, lease_ttl_s=60)
        async with httpx.AsyncClient(base_url=api.base_url) as c:
            submitted = await c.post("/experiments", json=MANIFEST, headers=auth("alice"))
            assert submitted.status_code == 202, submitted.text
            eid = submitted.json()["experiment_id"]
            deadline = time.monotonic() + 60
            while (info := await ledger.get_experiment(eid)) is None:
                assert importer.poll() is None and time.monotonic() < deadline
                await asyncio.sleep(0.1)  # the importer records it; nothing to wait on
            assert info.manifest["submitted_by"] == {"user": "alice", "team": "red"}

            cancel = f"/experiments/{eid}/cancel"
            by_bob = await c.post(cancel, headers=auth("bob"))
            assert by_bob.status_code == 403, by_bob.text
            assert "submitted by user alice (team red)" in by_bob.json()["error"]
            again_by_bob = await c.post("/experiments", json=MANIFEST, headers=auth("bob"))
            assert again_by_bob.status_code == 403, again_by_bob.text
            # A dry run is held to the same rule (it would answer for another's experiment).
            dry_by_bob = await c.post(
                "/experiments", json=MANIFEST, headers=auth("bob"), params={"dry_run": "true"}
            )
            assert dry_by_bob.status_code == 403, dry_by_bob.text
            dry_by_alice = await c.post(  # the control
                "/experiments", json=MANIFEST, headers=auth("alice"), params={"dry_run": "true"}
            )
            assert dry_by_alice.status_code == 200, dry_by_alice.text
            assert not await coordinator.is_cancelled(eid, fresh=True)
            unknown = await c.post("/experiments/no-such-experiment/cancel", headers=auth("bob"))
            assert unknown.status_code == 404, unknown.text
            # Controls: the submitter cancels; after a resubmission, an admin does.
            by_alice = await c.post(cancel, headers=auth("alice"))
            assert by_alice.status_code == 200, by_alice.text
            assert by_alice.json()["cancelled"] is True
            assert await coordinator.is_cancelled(eid, fresh=True)
            resubmitted = await c.post("/experiments", json=MANIFEST, headers=auth("alice"))
            assert resubmitted.status_code == 202, resubmitted.text
            assert not await coordinator.is_cancelled(eid, fresh=True)
            by_admin = await c.post(cancel, headers=auth("ops"))
            assert by_admin.status_code == 200, by_admin.text
            assert await coordinator.is_cancelled(eid, fresh=True)

            # Pause, resume and retry (of the experiment or one trial) follow the same rule.
            pause, resume = f"/experiments/{eid}/pause", f"/experiments/{eid}/resume"
            one = f"/experiments/{eid}/trials/hello__0001"
            every = f"/experiments/{eid}/retry-unscored"
            for path in (pause, resume, f"{one}/pause", f"{one}/resume", f"{one}/retry", every):
                refused = await c.post(path, headers=auth("bob"))
                assert refused.status_code == 403, refused.text
            assert not await coordinator.is_paused(eid, trial_id="hello__0001", fresh=True)
            held = await c.post(f"{one}/pause", headers=auth("alice"))
            assert held.status_code == 200 and held.json()["paused"] is True, held.text
            assert await coordinator.is_paused(eid, trial_id="hello__0001", fresh=True)
            assert not await coordinator.is_paused(eid, fresh=True)  # only that trial
            let_go = await c.post(f"{one}/resume", headers=auth("ops"))
            assert let_go.status_code == 200 and let_go.json()["was_paused"], let_go.text
            assert not await coordinator.is_paused(eid, trial_id="hello__0001", fresh=True)
            bad = await c.post(f"/experiments/{eid}/trials/-bad/pause", headers=auth("alice"))
            assert bad.status_code == 422 and "not a trial id" in bad.json()["error"], bad.text
            assert not await coordinator.is_paused(eid, fresh=True)
            paused = await c.post(pause, headers=auth("alice"))
            assert paused.status_code == 200 and paused.json()["paused"] is True, paused.text
            assert await coordinator.is_paused(eid, fresh=True)
            resumed = await c.post(resume, headers=auth("ops"))
            assert resumed.status_code == 200 and resumed.json()["was_paused"], resumed.text
            assert not await coordinator.is_paused(eid, fresh=True)
            # A trial with no record is not retried (it has not finished): 404.
            unfinished = await c.post(
                f"/experiments/{eid}/trials/any-trial/retry", headers=auth("alice")
            )
            assert unfinished.status_code == 404, unfinished.text
            assert "no finished trial" in unfinished.json()["detail"]
            # A finished trial of the (cancelled) experiment: its run would end unstarted
            # as cancelled, so it is refused, 409, saying how to lift the cancellation.
            finished = passed_record(1).model_copy(update={"experiment_id": eid})
            await ledger.upsert_records([finished])
            retry = f"/experiments/{eid}/trials/{finished.trial_id}/retry"
            queued = await work_messages(servers.nats_url, topology)
            in_cancelled = await c.post(retry, headers=auth("alice"))
            assert in_cancelled.status_code == 409, in_cancelled.text
            assert "resubmit its manifest" in in_cancelled.json()["error"]
            all_unscored = await c.post(every, headers=auth("alice"))
            assert all_unscored.status_code == 409, all_unscored.text
            assert await work_messages(servers.nats_url, topology) == queued
    finally:
        await nc.close()
        await ledger.close()
        importer.terminate()
        importer.wait(timeout=30)


async def test_start_up_refuses_unsafe_access_settings(
    start_api: StartApi, base_env: dict[str, str], tokens_file: Path, tmp_path: Path
) -> None:
    loose = write_tokens_file(tmp_path / "loose.yaml", TOKENS)
    loose.chmod(0o644)
    raw = tmp_path / "raw.yaml"
    raw.write_text(f"tokens:\n  - {{sha256: {TOKENS['alice'][0]}, user: alice}}\n")
    raw.chmod(0o600)
    cases = [
        ({"TRIALBUS_HTTP_HOST": "0.0.0.0"}, "the HTTP API needs tokens"),
        ({"TRIALBUS_HTTP_HOST": "127.0.0.1"}, "the HTTP API needs tokens"),
        (
            {"TRIALBUS_HTTP_HOST": "0.0.0.0", "TRIALBUS_API_NO_AUTH": "true"},
            "TRIALBUS_API_NO_AUTH is accepted only on a loopback address",
        ),
        ({"TRIALBUS_API_TOKENS_FILE": str(loose)}, f"run `chmod 600 {loose}`"),
        ({"TRIALBUS_API_TOKENS_FILE": str(raw)}, "tokens[0].sha256: must be the token's SHA-256"),
        (
            {
                "TRIALBUS_API_TOKENS_FILE": str(tokens_file),
                "TRIALBUS_API_DATASET_REGISTRIES": "harbor, registry.json",
            },
            "TRIALBUS_API_DATASET_REGISTRIES: 'registry.json' is not a registry",
        ),
    ]
    for overrides, message in cases:
        env = service_env(base_env, TRIALBUS_HTTP_PORT=str(free_port()), **overrides)
        done = await asyncio.to_thread(run_to_exit, env)
        assert (done.returncode, message) == (2, message), done.stderr[-2000:]
        assert message in done.stderr
        assert TOKENS["alice"][0] not in done.stderr  # a pasted token is never echoed
    # Control: no-auth on loopback serves, still without text/plain or foreign pages.
    api = start_api(TRIALBUS_API_NO_AUTH="true", TRIALBUS_API_TOKENS_FILE="")
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        assert (await c.post("/experiments", json=MANIFEST)).status_code == 202
        plain = {"Content-Type": "text/plain"}
        r = await c.post("/experiments", content=MANIFEST_YAML, headers=plain)
        assert r.status_code == 415
        foreign = {"Origin": "http://evil.example"}
        assert (await c.post("/experiments/x/cancel", headers=foreign)).status_code == 403


async def test_yaml_parsing_does_not_stall_the_api(start_api: StartApi) -> None:
    api = start_api()
    # ~95,000 YAML nodes (under the parser's budget of 100,000): seconds of CPU, then
    # refused for the unknown field. Meanwhile /healthz must keep answering.
    slow = MANIFEST_YAML + "padding: [" + "0, " * 95_000 + "0]\n"
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=api.base_url, timeout=120) as c:
        start = time.monotonic()
        post = asyncio.create_task(
            c.post(
                "/experiments",
                content=slow,
                headers={"Content-Type": "application/yaml", **auth("alice")},
            )
        )
        while not post.done():
            t = time.monotonic()
            assert (await c.get("/healthz")).status_code == 200
            latencies.append(time.monotonic() - t)
        response = await post
        duration = time.monotonic() - start
    assert response.status_code == 422, response.text
    assert "padding: unknown field" in response.json()["error"]
    assert duration > 1.0, f"inconclusive: the parse took only {duration:.2f} s"
    assert max(latencies) < duration / 4, (
        f"/healthz waited {max(latencies):.2f} s during a {duration:.2f} s parse: "
        "the parse runs on the event loop"
    )


async def test_without_a_tasks_root_a_posted_manifest_stays_in_the_working_folder(
    start_api: StartApi, nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    # Before, TRIALBUS_TASKS_ROOT unset meant any folder of the submitter's host: a token
    # holder could submit another team's private task (solution and tests included).
    private = tmp_path / "private" / "hello-file"
    shutil.copytree(REPO / "examples" / "tasks" / "hello-file", private)
    api = start_api(TRIALBUS_TASKS_ROOT="")  # the service runs in the repository
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        outside = {**MANIFEST, "name": "outside", "tasks": [str(private)]}
        refused = await c.post("/experiments", json=outside, headers=auth("alice"))
        assert refused.status_code == 422, refused.text
        # Named as the client sees it (where the root lies on this host is not said).
        assert "outside the tasks root <tasks root>" in refused.json()["error"]
        assert str(REPO) not in refused.json()["error"]
        assert await work_messages(nats_url, topology) == 0
        # Control: a task folder inside the working folder is accepted.
        inside = {**MANIFEST, "name": "inside", "tasks": ["examples/tasks/hello-file"]}
        accepted = await c.post("/experiments", json=inside, headers=auth("alice"))
        assert accepted.status_code == 202, accepted.text
    assert await work_messages(nats_url, topology) == 1


async def test_the_api_fetches_datasets_only_from_the_registries_its_operator_allows(
    start_api: StartApi, base_env: dict[str, str], servers: Servers
) -> None:
    nats_url, topology, tmp_path = servers.nats_url, servers.topology, servers.tmp_path
    # A dataset entry makes the API's host download from a registry and from the git
    # repositories it lists: from any a token holder names, that would be an internal
    # address or a local repository. Two registries are served on loopback, each
    # counting the requests it gets; the operator allows the first.
    tasks = {"hello-file": EXAMPLE_TASKS / "hello-file"}
    allowed_registry = task_registry(tmp_path / "allowed", tasks)
    other_registry = task_registry(tmp_path / "other", tasks)
    with (
        served_file(allowed_registry.file) as (allowed_url, allowed_requests),
        served_file(other_registry.file) as (other_url, other_requests),
    ):

        def manifest(name: str, **entry: str) -> dict[str, Any]:
            return {**MANIFEST, "name": name, "tasks": [{"dataset": "mini@1.0", **entry}]}

        cache = str(tmp_path / "cache")
        unset = start_api(TRIALBUS_DATASET_CACHE=cache)
        async with httpx.AsyncClient(base_url=unset.base_url) as c:
            refused = await c.post(
                "/experiments", json=manifest("a", registry_url=allowed_url), headers=auth("alice")
            )
        assert refused.status_code == 422, refused.text
        assert "not fetched here" in refused.json()["error"]
        assert "TRIALBUS_API_DATASET_REGISTRIES, unset here" in refused.json()["error"]

        api = start_api(TRIALBUS_DATASET_CACHE=cache, TRIALBUS_API_DATASET_REGISTRIES=allowed_url)
        async with httpx.AsyncClient(base_url=api.base_url, timeout=120) as c:
            for entry, named in (
                ({"registry_url": other_url}, f"registry_url {other_url!r}"),
                ({}, "Harbor's registry"),
                ({"registry_path": str(other_registry.file)}, "registry_path "),
            ):
                refused = await c.post(
                    "/experiments", json=manifest("b", **entry), headers=auth("alice")
                )
                assert refused.status_code == 422, refused.text
                assert refused.json()["error"].startswith(
                    f"tasks[0]: dataset 'mini@1.0': the HTTP API does not fetch from {named}"
                ), refused.json()["error"]
            assert allowed_requests == other_requests == []
            assert await work_messages(nats_url, topology) == 0
            # Control: the allowed registry's dataset is fetched and its trial queued.
            accepted = await c.post(
                "/experiments", json=manifest("c", registry_url=allowed_url), headers=auth("alice")
            )
            assert accepted.status_code == 202, accepted.text
        assert allowed_requests == ["/registry.json"] and other_requests == []
        assert await work_messages(nats_url, topology) == 1

        # The CLI, on its user's machine, fetches from any registry its manifest names.
        path = tmp_path / "dataset.yaml"
        path.write_text(json.dumps(manifest("d", registry_url=other_url)))
        env = {**service_env(base_env), "TRIALBUS_DATASET_CACHE": cache}
        argv = [str(TRIALBUS), "submit", str(path), "--dry-run", "--json"]
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["tasks"] == ["hello-file"]
        assert other_requests == ["/registry.json"]
