"""Tests of trust boundaries against real processes (issue 11); see docs/security.md."""
