"""A runner process publishes its policy; the submitter refuses early what it would
refuse, and the runner refuses it again when the submitter is bypassed.

A real runner process (``python -m services.runner``, its policy file named by
``TRIALBUS_POLICY_FILE``) on the session's nats-server, and the submitter's HTTP API
in-process. Before the policy, the refused manifest below was accepted (202) and its
trial ran with the agent's key sent to ``evil.example``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import NotFoundError

from infra.service_process import ServiceProcess
from schemas.events import TrialCompleted, TrialFailed, parse_event
from schemas.subjects import Topology
from services.common.adapters.nats_registry import NatsRunnerRegistry
from tests.support.importer_process import until
from tests.support.runner_policy import StartRunner, write_policy
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

RUNNER_ID = "policy-runner"
HOST_PATH = Path("/etc/trialbus-owned")
MANIFEST = """\
name: {name}
tasks: [hello-file]
agents:
  - name: {agent}
{agent_extra}
compute:
  environment: local
{compute_extra}
"""
EVIL_AGENT = "    kwargs: {api_base: 'http://evil.example/v1'}"
EVIL_COMPUTE = f"  environment_kwargs: {{scratch_dir: {HOST_PATH}}}"

Client = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
async def runner(
    tmp_path: Path, nats_url: str, topology: Topology, policy_runner: StartRunner
) -> AsyncIterator[ServiceProcess]:
    """A runner process under a policy file, live in the registry with its policy."""
    policy = write_policy(tmp_path / "policy", extra_secret_names=["MYLLM_API_KEY"])
    proc = policy_runner(policy, RUNNER_ID, MYLLM_API_KEY="")  # allowed, but no key
    nc = await nats.connect(nats_url)
    try:
        registry = await NatsRunnerRegistry.open(nc.jetstream(), topology)

        async def live() -> bool:
            return any(r.runner_id == RUNNER_ID for r in await registry.live_runners())

        await until("the runner's registry record", live, proc, 90)
        [me] = [r for r in await registry.live_runners() if r.runner_id == RUNNER_ID]
        # What it publishes is its policy file's, not a default, and its Harbor's agents.
        assert me.policy is not None and "MYLLM_API_KEY" in me.policy.allowed_secrets
        assert me.harbor_agents is not None and {"oracle", "nop"} <= set(me.harbor_agents)
        assert me.secrets_set is not None and "MYLLM_API_KEY" not in me.secrets_set
        yield proc
    finally:
        await nc.close()


@pytest.fixture
def client(servers: Servers) -> Client:
    """The submitter's HTTP API in-process (no auth on loopback; tasks from examples)."""

    def open_client(check_runners: bool) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        return servers.examples_api(check_runners=check_runners)

    return open_client


def manifest(name: str, agent_extra: str = "", compute_extra: str = "", agent: str = "nop") -> str:
    return MANIFEST.format(
        name=name, agent=agent, agent_extra=agent_extra, compute_extra=compute_extra
    )


async def post(api: httpx.AsyncClient, text: str) -> httpx.Response:
    return await api.post(
        "/experiments", content=text, headers={"Content-Type": "application/yaml"}
    )


async def ending(
    nats_url: str, topology: Topology, experiment_id: str, proc: ServiceProcess
) -> TrialCompleted | TrialFailed:
    """The event that ends the experiment's one trial, read from the events stream."""
    nc = await nats.connect(nats_url)
    found: list[TrialCompleted | TrialFailed] = []
    try:
        js = nc.jetstream()

        async def ended() -> bool:
            for kind in ("trial_completed", "trial_failed"):
                subject = topology.event_subject(kind, experiment_id)
                try:
                    msg = await js.get_last_msg(topology.events_stream, subject)
                except NotFoundError:
                    continue
                event = parse_event(msg.data or b"")
                assert isinstance(event, TrialCompleted | TrialFailed)
                if isinstance(event, TrialCompleted) or event.final:
                    found.append(event)
                    return True
            return False

        await until(f"the end of {experiment_id}'s trial", ended, proc, 180)
    finally:
        await nc.close()
    return found[0]


async def test_the_submitter_refuses_early_and_the_runner_refuses_again(
    runner: ServiceProcess, client: Client, nats_url: str, topology: Topology
) -> None:
    async with client(check_runners=True) as api:
        refused = await post(api, manifest("policy-early", agent_extra=EVIL_AGENT))
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert "agents[0].kwargs.api_base: host 'evil.example' is not in the runner policy's" in (
            error
        )
        assert f"policy of runner '{RUNNER_ID}'" in error
        # Control: the same manifest without the endpoint is accepted and runs.
        accepted = await post(api, manifest("policy-early"))
        assert accepted.status_code == 202, accepted.text
        done = await ending(nats_url, topology, accepted.json()["experiment_id"], runner)
        assert isinstance(done, TrialCompleted), done

    # The submitter bypassed (it does not check runners): the runner itself refuses.
    async with client(check_runners=False) as api:
        bypass = await post(api, manifest("policy-bypass", compute_extra=EVIL_COMPUTE))
        assert bypass.status_code == 202, bypass.text
        started = time.monotonic()
        failed = await ending(nats_url, topology, bypass.json()["experiment_id"], runner)
    assert isinstance(failed, TrialFailed), failed
    assert (failed.error_type, failed.final, failed.attempt) == ("PolicyRefused", True, 1)
    assert "compute.environment_kwargs.scratch_dir: not a key the runner policy allows" in (
        failed.message
    )
    assert not HOST_PATH.exists()
    assert time.monotonic() - started < 60, "a refusal is never retried with backoff"


async def test_a_misspelt_agent_is_refused_at_submit_and_by_the_runner(
    runner: ServiceProcess, client: Client, nats_url: str, topology: Topology
) -> None:
    # Before, both were accepted: each trial failed with Harbor's bare ValueError,
    # read as an infrastructure failure and retried with backoff.
    async with client(check_runners=True) as api:
        refused = await post(api, manifest("agent-typo", agent="orcale"))
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error.startswith(
            "agents[0].name: 'orcale' is not an agent Harbor ships (did you mean 'oracle'?"
        ), error
        assert "on the live runners of pool 'default')" in error
    async with client(check_runners=False) as api:
        bypass = await post(api, manifest("agent-typo-bypass", agent="orcale"))
        assert bypass.status_code == 202, bypass.text
        started = time.monotonic()
        failed = await ending(nats_url, topology, bypass.json()["experiment_id"], runner)
    assert isinstance(failed, TrialFailed), failed
    assert (failed.error_type, failed.final, failed.attempt) == ("UnknownAgent", True, 1)
    assert "did you mean 'oracle'?" in failed.message
    assert time.monotonic() - started < 60, "a refusal is never retried with backoff"


async def test_an_api_key_no_runner_has_is_refused_at_submit_and_by_the_runner(
    runner: ServiceProcess, client: Client, nats_url: str, topology: Topology
) -> None:
    # Before, it was accepted and each trial ended at once as a final MissingSecretError:
    # an experiment of unscored infrastructure failures, its cause only in the report.
    keyed = "    api_key_env: [MYLLM_API_KEY]"
    async with client(check_runners=True) as api:
        refused = await post(api, manifest("key-missing", agent_extra=keyed))
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"] == (
            "agents[0].api_key_env[0]: MYLLM_API_KEY is set on no live runner of pool "
            "'default' (a runner reads its keys from its environment when it starts: set "
            "them there, e.g. in the shell of `trialbus up`, and restart the runners)"
        )
    async with client(check_runners=False) as api:
        bypass = await post(api, manifest("key-missing-bypass", agent_extra=keyed))
        assert bypass.status_code == 202, bypass.text
        failed = await ending(nats_url, topology, bypass.json()["experiment_id"], runner)
    assert isinstance(failed, TrialFailed), failed
    assert (failed.error_type, failed.final, failed.attempt) == ("MissingSecretError", True, 1)
    # Ended before it starts: no other live runner of the pool has the key either.
    assert failed.message.startswith(
        f"runner on {failed.runner_host} (pool 'default') has no MYLLM_API_KEY set "
        "(api_key_env of agent 'nop'), nor does any other live runner of pool 'default'"
    ), failed.message
    # A name its policy does not allow: refused by the policy, not called missing.
    other = "    api_key_env: [OTHERLLM_API_KEY]"
    async with client(check_runners=False) as api:
        bypass = await post(api, manifest("key-not-allowed-bypass", agent_extra=other))
        assert bypass.status_code == 202, bypass.text
        refused_run = await ending(nats_url, topology, bypass.json()["experiment_id"], runner)
    assert isinstance(refused_run, TrialFailed), refused_run
    assert (refused_run.error_type, refused_run.final) == ("PolicyRefused", True)
    assert "may not pass OTHERLLM_API_KEY to a trial" in refused_run.message
    assert "add it to extra_secret_names on the runners" in refused_run.message
