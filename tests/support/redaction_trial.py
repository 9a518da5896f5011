"""Two deliveries of one work message through the runner's real handler (own process).

``python -m tests.support.redaction_trial NATS_URL PREFIX WORK_DIR``: builds what the
runner's composition root builds (services.runner.app: HarborExecutor and TrialFolders
with the runner's TrialSecrets, NatsCoordinator, JetStreamBus; the secrets come from
this process's environment, as a runner's do) and hands TrialHandler one TrialRequested
of tests.support.raising_leak_agent on hello-file (local environment) twice: attempt 1
fails with a retryable error (a TrialFailed carrying Harbor's exception message), and
attempt 2, the last the retry policy allows, stores the trial folder in the results
bucket (a TrialCompleted pointing at it). The local folders are kept (keep_local) so
the test can show what Harbor wrote before redaction.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import nats

from schemas.events import TaskRef, TrialRequested, encode_event
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from schemas.runners import RunnerPolicy
from services.common.adapters.jetstream import JetStreamBus, ensure_streams
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_objects import open_bucket
from services.common.redaction import TrialSecrets
from services.common.settings import RunnerSettings
from services.common.task_cache import TaskCache, upload_task
from services.common.trial_folders import TrialFolders
from services.runner.handlers import TrialHandler
from services.runner.harbor_executor import HarborExecutor
from services.runner.trial_process import SandboxSettings
from tests.support.leak_agent import SHOWN
from tests.support.live_log_trial import HELLO_FILE

AGENT = "tests.support.raising_leak_agent:RaisingLeakAgent"
TRIAL_ID = "hello-file__redaction"


async def main(nats_url: str, prefix: str, work: Path) -> None:
    settings = RunnerSettings(nats_url=nats_url, prefix=prefix)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js, settings.topology)
    tasks_store = await open_bucket(js, settings, "tasks")
    task = await upload_task(tasks_store, HELLO_FILE)
    request = TrialRequested(
        experiment_id="exp-redaction",
        correlation_id="corr",
        trial_id=TRIAL_ID,
        task=TaskRef(name="hello-file", checksum=task.name),
        agent=AgentSpec(import_path=AGENT, api_key_env=[*SHOWN]),
        repetition=0,
        compute=ComputeSpec(environment="local"),
        retry=RetrySpec(max_attempts=2, backoff_seconds=0, max_backoff_seconds=0),
    )
    secrets = TrialSecrets.from_settings(settings)
    executor = HarborExecutor(
        work / "jobs",
        TaskCache(work / "tasks", tasks_store, budget_bytes=64 * 2**20),
        SandboxSettings(scratch_dir=work / "sandbox"),
        policy=RunnerPolicy(agent_import_paths=[AGENT], extra_secret_names=["MYLLM_CRED"]),
        secrets=secrets,
    )
    folders = TrialFolders(
        await open_bucket(js, settings, "results"),
        cap_bytes=settings.result_cap_bytes,
        keep_local=True,
        scrub_for=lambda r: secrets.redactor(r).redact_file,
    )
    handler = TrialHandler(
        JetStreamBus(js, settings.topology),
        executor,
        await NatsCoordinator.open(js, settings.topology, lease_ttl_s=60),
        folders,
        runner_id="redaction-test",
        host="test-host",
        heartbeat_s=5,
    )

    async def keep_alive() -> None:
        return None

    verdicts = [await handler.handle(encode_event(request), keep_alive) for _ in range(2)]
    await nc.drain()
    (work / "verdicts.txt").write_text("\n".join(f"{v.action} {v.reason}" for v in verdicts))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
