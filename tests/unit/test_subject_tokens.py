"""Every name that becomes a subject token (pool, priority class, topology prefix,
JetStream domain) is checked by one rule-and-message path (schemas.subjects.checked_token):
a bad name is refused with the name, the pattern and the rule in words; a good one passes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from infra.nats_permissions import check_js_domain
from schemas.subjects import Topology, check_class, check_pool

LOWER = "lowercase letters, digits and '-', starting with a letter, at most 32 characters"


def _prefix(value: str) -> str:
    return Topology(prefix=value).prefix


@pytest.mark.parametrize(
    ("check", "good", "bad", "message"),
    [
        (
            check_pool,
            "gpu-a",
            "GPU",
            f"runner pool 'GPU' must match ^[a-z][a-z0-9-]{{0,31}}$ ({LOWER})",
        ),
        (
            check_class,
            "urgent",
            "x.y",
            f"priority class 'x.y' must match ^[a-z][a-z0-9-]{{0,31}}$ ({LOWER})",
        ),
        (
            _prefix,
            "t_1-a",
            "9t",
            "topology prefix '9t' must match ^[a-z][a-z0-9_-]{0,31}$ (lowercase letters, "
            "digits, '-' or '_', at most 32 characters)",
        ),
        (
            check_js_domain,
            "Hub_1",
            "a.b",
            "JetStream domain 'a.b' must match ^[A-Za-z0-9_-]{1,32}$ (it is a token of the "
            "$JS.<domain>.API subjects)",
        ),
    ],
)
def test_a_bad_token_is_refused_with_its_rule_and_a_good_one_passes(
    check: Callable[[str], str], good: str, bad: str, message: str
) -> None:
    assert check(good) == good  # the control: the same check lets a valid name through
    with pytest.raises(ValueError) as refused:
        check(bad)
    assert str(refused.value) == message
