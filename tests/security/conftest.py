"""The sandbox security tests drive ``LocalEnvironment`` through tests/support/sandbox_env.

Importing the fixtures here makes ``layers`` and ``make_env`` available to every test
in this folder.
"""

from __future__ import annotations

from tests.support.sandbox_env import layers, make_env

__all__ = ["layers", "make_env"]
