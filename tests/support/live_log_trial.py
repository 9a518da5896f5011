"""One Harbor trial of tests.support.leak_agent whose live output goes through the
runner's live-log sinks to a real nats-server (run as its own process).

``python -m tests.support.live_log_trial NATS_URL PREFIX WORK_DIR``: the secrets come
from this process's environment, as a runner's do. Harbor's log callback feeds the
sink exactly as services.runner.trial_process forwards it; the raw texts are also
written to WORK_DIR/raw.txt so the test can show they held the secrets (its control),
and the number of events published to WORK_DIR/published.txt.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import nats

from schemas.events import TrialRequested
from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH, AgentSpec, ComputeSpec
from services.common.settings import RunnerSettings
from services.runner.live_logs import CoreNatsLogSinks
from tests.support.leak_agent import SHOWN
from tests.support.work_requests import hello_file_request

ROOT = Path(__file__).resolve().parents[2]
HELLO_FILE = ROOT / "examples" / "tasks" / "hello-file"
TRIAL_ID = "hello-file__leak"


def request() -> TrialRequested:
    """The work message a runner would get for this trial."""
    agent = AgentSpec(import_path="tests.support.leak_agent:LeakAgent", api_key_env=[*SHOWN])
    return hello_file_request(
        TRIAL_ID,
        agent,
        experiment_id="exp-leak",
        correlation_id="corr",
        task_path=str(HELLO_FILE),
        compute=ComputeSpec(environment="local"),
    )


async def main(nats_url: str, prefix: str, work: Path) -> None:
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.hooks import LogEntry
    from harbor.trial.trial import Trial

    settings = RunnerSettings(nats_url=nats_url, prefix=prefix)
    nc = await nats.connect(nats_url)
    req = request()
    published = 0

    async def publish(subject: str, payload: bytes) -> None:
        nonlocal published
        published += 1
        await nc.publish(subject, payload)

    sink = CoreNatsLogSinks.from_settings(publish, settings)(req)
    raw: list[str] = []
    config = TrialConfig(
        task=TaskConfig(path=HELLO_FILE),
        trial_name=req.trial_id,
        trials_dir=work / "jobs",
        agent=AgentConfig(
            import_path=req.agent.import_path,
            env={n: f"${{{n}}}" for n in req.agent.api_key_env},  # as the runner does
        ),
        environment=EnvironmentConfig(
            import_path=LOCAL_ENVIRONMENT_IMPORT_PATH,
            kwargs={"scratch_dir": str(work / "sandbox")},
        ),
    )
    trial = await Trial.create(config)

    async def forward(entry: LogEntry) -> None:
        raw.append(entry.text)
        await sink(entry.phase, entry.stream, entry.text)

    trial.add_log_callback(forward)
    result = await trial.run()
    await sink.close()
    await nc.drain()
    (work / "raw.txt").write_text("".join(raw))
    (work / "published.txt").write_text(str(published))
    if result.exception_info is not None:
        raise SystemExit(f"trial failed: {result.exception_info.exception_type}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
