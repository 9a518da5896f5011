"""trialbus's exception tree, and the one rule that settles a message from an outcome.

    TrialbusError
    ├── UserInputError        a user can fix it (manifest, task folder, job dir): exit 2
    │   ├── ManifestError
    │   └── ExperimentNotFound  the ledger knows no such experiment (HTTP 404)
    ├── TransientError        try again later: the message is nak'ed with a delay
    │   └── LedgerUnavailable the ledger cannot be reached
    │   └── ObjectMissing     a referenced object is not (or not yet) in its bucket
    ├── ObjectCorrupt         a fetched object does not match its reference's sha256
    ├── PoisonMessage         can never succeed: the message is terminated (logged)
    │   (schemas.events.EventDecodeError is treated as one: schemas has no service code)
    └── InternalError         an invariant of trialbus itself broke (a bug)

Anything raised at a message edge that is not Transient or Poison is a bug (an
InternalError, or any exception trialbus did not expect). A bug never acknowledges a
message and never terminates it: the message is nak'ed with a longer delay, so it is
redelivered (nothing lost) while the error is logged with the event's ids for a fix.
``settle_error`` is the only place that decides this; the runner, the importer and the
watcher all call it, and the JetStream adapter applies the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.events import EventDecodeError


class TrialbusError(Exception):
    """Base of trialbus's own errors."""


class UserInputError(TrialbusError):
    """Bad input a user can fix; the message names the file, the field and the fix."""


class ManifestError(UserInputError):
    """An experiment manifest is invalid."""


class ExperimentNotFound(UserInputError):
    """An experiment id the ledger holds neither metadata nor records for."""


class ExperimentCancelled(UserInputError):
    """A run asked of a cancelled experiment: its runners would end it unstarted."""


class TransientError(TrialbusError):
    """A dependency is unavailable for now; retry later."""


class LedgerUnavailable(TransientError):
    """The ledger could not be reached; the caller should retry later."""


class ObjectMissing(TransientError):
    """A referenced object is not in its bucket (yet, or any more: retention)."""


class ObjectCorrupt(TrialbusError):
    """Fetched bytes do not match the reference's size or sha256 (never used as is)."""


class ObjectAccessDenied(TrialbusError):
    """The NATS user may not read or write a bucket (a permissions violation the server
    reported): configuration, not a blip; the message names the right that is missing."""


class PoisonMessage(TrialbusError):
    """A message that can never be processed (malformed, unknown type or version)."""


class InternalError(TrialbusError):
    """An invariant of trialbus itself does not hold: a bug to fix, never the input's fault."""


@dataclass(frozen=True, slots=True)
class Settle:
    """How a consumed message is settled: acknowledged, handed back, or terminated.

    ``nak`` carries the delay before JetStream redelivers the message.
    """

    action: Literal["ack", "nak", "term"]
    delay_s: float = 0.0
    reason: Literal["done", "transient", "poison", "bug", "retry", "handback", "handoff"] = "done"
    """Why: ``handback``, back in the queue unstarted for now (a pause, a full lease);
    ``handoff``, left for another runner: this one lacks what the trial needs."""


ACK = Settle("ack")


def nak(
    delay_s: float, reason: Literal["transient", "bug", "retry", "handback", "handoff"]
) -> Settle:
    """Hand a message back for redelivery after ``delay_s`` seconds."""
    return Settle("nak", max(0.0, delay_s), reason)


TERM = Settle("term", reason="poison")

# A bug is retried later than a transient error: often a redeployment fixes it, and a
# hot loop of the same failure would flood the logs.
BUG_RETRY_DELAY_S = 10.0


def settle_error(exc: BaseException, *, transient_delay_s: float) -> Settle:
    """The verdict for a handler that raised ``exc`` (see the tree above)."""
    if isinstance(exc, PoisonMessage | EventDecodeError):
        return TERM
    if isinstance(exc, TransientError):
        return nak(transient_delay_s, "transient")
    return nak(max(transient_delay_s, BUG_RETRY_DELAY_S), "bug")


# Exit codes of the CLI (documented in the README).
EXIT_OK = 0
EXIT_TRIALS_UNSCORED = 1
EXIT_USER_ERROR = 2
EXIT_UNAVAILABLE = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130
