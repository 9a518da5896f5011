"""How often a runner keeps a running trial alive (services.runner.app.heartbeat_interval):
three beats at least per ack wait and per lease TTL. The leases bucket's TTL is the
one whoever created the bucket set (an admin's provisioning, the submitter first: 60 s),
which may be shorter than this runner's own ack wait: a beat longer than a third of it
would let the experiment's slot lapse while the trial runs, and another trial take it."""

from __future__ import annotations

import pytest

from services.common.settings import RunnerSettings
from services.runner.app import heartbeat_interval


def _settings(ack_wait_s: float, heartbeat_s: float) -> RunnerSettings:
    return RunnerSettings(ack_wait_s=ack_wait_s, heartbeat_s=heartbeat_s)


@pytest.mark.parametrize(
    ("ack_wait_s", "heartbeat_s", "lease_ttl_s", "beat"),
    [
        (60, 15, 60, 15),  # the defaults: the setting
        (60, 15, None, 15),  # a bucket without TTL: the setting
        (60, 30, None, 20),  # three beats per ack wait
        (600, 120, 60, 20),  # a bucket made with 60 s: three beats per lease TTL
        (4, 1, 60, 1),  # a longer TTL changes nothing (the control)
    ],
)
def test_a_beat_is_a_third_of_the_shortest_expiry_at_most(
    ack_wait_s: float, heartbeat_s: float, lease_ttl_s: float | None, beat: float
) -> None:
    assert heartbeat_interval(_settings(ack_wait_s, heartbeat_s), lease_ttl_s) == pytest.approx(
        beat
    )
