"""Unit-test fixtures.

Real Harbor trial folders come from tests/harbor_fixtures.py. They are imported here
rather than listed in ``pytest_plugins``: pytest rejects ``pytest_plugins`` in a
conftest.py below the rootdir (a plain ``pytest`` run then fails to collect).
"""

from tests.harbor_fixtures import harbor_trials

__all__ = ["harbor_trials"]
