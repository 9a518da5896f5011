"""trialbus's exception tree, and how each class is settled at the message edge.

    TrialbusError
    ├── UserInputError      a user can fix it (manifest, task folder, job dir): exit 2
    │   └── ManifestError
    ├── TransientError      try again later: the message is nak'ed with a delay
    │   (services.common.ledger.LedgerUnavailable is one)
    └── PoisonMessage       can never succeed: the message is terminated (logged)

Anything else raised by a handler is a bug: the message is nak'ed with a delay so
nothing is lost, and the error is logged with the event's ids.
"""

from __future__ import annotations


class TrialbusError(Exception):
    """Base of trialbus's own errors."""


class UserInputError(TrialbusError):
    """Bad input a user can fix; the message names the file, the field and the fix."""


class ManifestError(UserInputError):
    """An experiment manifest is invalid."""


class TransientError(TrialbusError):
    """A dependency is unavailable for now; retry later."""


class PoisonMessage(TrialbusError):
    """A message that can never be processed (malformed, unknown type or version)."""


# Exit codes of the CLI (documented in the README).
EXIT_OK = 0
EXIT_TRIALS_UNSCORED = 1
EXIT_USER_ERROR = 2
EXIT_UNAVAILABLE = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130
