"""What the watcher redacts from external Harbor job folders before they leave it.

A job folder made outside trialbus was filled by whoever ran Harbor, often from the
same shell or host as the watcher: its agent logs, trajectories and result.json can
quote an API key of that environment, or a password of trialbus's own (a ledger URL
exported in the shell). Before, the watcher stored such folders in the results bucket
as they were, and the importer copied their text into ledger records.

The watcher knows two kinds of secrets, and redacts both exactly as a runner redacts
its trials (services.common.redaction: the value and its base64 forms become
``[redacted:NAME]``): its own credentials (the NATS credentials file's password, the
passwords of ``NATS_URL`` and ``LEDGER_URL``), and the values of the variables of its
environment whose names look like secrets (Harbor's own rule: a name holding KEY,
SECRET, TOKEN, PASSWORD, CREDENTIAL or AUTH). A key the watcher's environment does
not hold cannot be known, and is not caught (docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from services.common.redaction import Redactor, runner_secrets
from services.common.settings import WatcherSettings

_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN(?!S)|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)


def secret_named(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def watcher_redactor(settings: WatcherSettings, environ: Mapping[str, str]) -> Redactor:
    """The redactor of the watcher configured by ``settings`` in ``environ``."""
    found = {name: value for name, value in environ.items() if secret_named(name) and value}
    found.update(
        runner_secrets(
            settings.nats_credentials,
            {"NATS_URL": settings.nats_url, "LEDGER_URL": settings.ledger_url},
        )
    )
    return Redactor(found)
