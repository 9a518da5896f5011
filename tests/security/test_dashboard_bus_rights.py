"""The dashboard's live feeds work with the submitter role's NATS rights, and only
read: it follows the events and logs streams (infra/nats_permissions.py grants the
submitter ``_follow`` on both), and still cannot publish a log line.

Against a real nats-server with one user per role (the fixtures of
test_bus_permissions.py).
"""

from __future__ import annotations

import pytest

from schemas.events import TrialLog, TrialStarted, encode_event
from services.submitter.live_feeds import LiveFeeds
from tests.security.test_bus_permissions import TOPO, Role, _exp, bus, roles

pytestmark = pytest.mark.integration
__all__ = ["bus", "roles"]  # fixtures, used by name


async def test_submitter_follows_events_and_live_logs_read_only(roles: dict[str, Role]) -> None:
    submitter, runner = roles["submitter"], roles["runner"]
    exp = _exp()
    trial = f"{exp}-t1"
    feeds = LiveFeeds(submitter.nc, TOPO)
    started = TrialStarted(experiment_id=exp, trial_id=trial, runner_id="r", host="h", attempt=1)
    await runner.js.publish(TOPO.event_subject("trial_started", exp), encode_event(started))
    assert set(await feeds.started_trials(exp)) == {trial}

    line = TrialLog(experiment_id=exp, trial_id=trial, phase="agent", stream="stdout", text="hi")
    subject = TOPO.log_subject(exp, trial)
    await runner.nc.publish(subject, encode_event(line))  # core publish, like live_logs
    async with feeds.trial_log(trial) as feed:
        got = await feed.next(10)
    assert isinstance(got, TrialLog) and got.text == "hi"

    # Reading is all: the submitter cannot write into the logs stream.
    await submitter.denied(submitter.js.publish(subject, b"{}"), "Publish", subject)
