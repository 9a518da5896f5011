"""The chaos run uses the end-to-end stack fixtures (tests/e2e/conftest.py)."""

from tests.e2e.conftest import cli, stack, stacks

__all__ = ["cli", "stack", "stacks"]
