"""A hello-file work message (TrialRequested) for tests of what a runner does with one,
and the work messages a submission published (``work_messages``).

The live-log tests build the same message with different agents and ids; the golden
instances with fixed ids are in tests/support/sample_events.py.
"""

from __future__ import annotations

import nats

from schemas.events import TaskRef, TrialRequested, parse_event
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from schemas.subjects import Topology


def hello_file_request(
    trial_id: str,
    agent: AgentSpec,
    *,
    experiment_id: str,
    correlation_id: str,
    task_path: str = "/tasks/hello-file",
    compute: ComputeSpec | None = None,
) -> TrialRequested:
    """Repetition 0 of the hello-file task by ``agent``, default retry policy.

    ``task_path`` goes on the wire only while TaskRef still has its ``path`` field.
    """
    task: dict[str, str] = {"name": "hello-file", "checksum": "ab" * 32}
    if "path" in TaskRef.model_fields:  # the field is leaving the wire format
        task["path"] = task_path
    return TrialRequested(
        experiment_id=experiment_id,
        correlation_id=correlation_id,
        trial_id=trial_id,
        task=TaskRef.model_validate(task),
        agent=agent,
        repetition=0,
        compute=compute or ComputeSpec(),
        retry=RetrySpec(),
    )


async def work_messages(nats_url: str, topology: Topology) -> list[TrialRequested]:
    """Every TrialRequested in the work stream, in order (read by sequence: a work
    queue stream takes no second consumer)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(topology.work_stream)).state.last_seq
        found = []
        for seq in range(1, last + 1):
            event = parse_event((await js.get_msg(topology.work_stream, seq)).data or b"")
            assert isinstance(event, TrialRequested)
            found.append(event)
        return found
    finally:
        await nc.close()
