"""Which of the shell's ``TRIALBUS_*`` settings ``trialbus up`` hands its services.

An operator sets up the embedded stack the way they set up any service: ``export
TRIALBUS_QUOTAS_FILE=quotas.yaml`` (or ``TRIALBUS_API_DATASET_REGISTRIES=harbor``,
``TRIALBUS_POLICY_FILE=...``), then ``trialbus up``. Every setting some service reads
(services.common.settings) reaches every service, and the stack's own NATS is
provisioned by them (priority classes, the runners' ack wait). Three kinds are not
passed, and the console says which and why:

- the settings the stack itself decides (:data:`STACK_OWNED`): where its servers are,
  its folders, its credentials, ``--concurrency``. A leftover ``NATS_URL`` of another
  installation must not send the stack's services there;
- names no service reads (a typo: said with the nearest real name);
- the CLI's own (:data:`CLIENT_ONLY`), which are no service's business.

A relative path in a path setting is made absolute against the folder ``trialbus up``
was started in, so a service reads the file the operator named wherever it runs.

The demo (``trialbus demo``) takes none of them: it shows what trialbus does as
shipped, the same on every machine.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common.settings import (
    CommonSettings,
    ImporterSettings,
    RunnerSettings,
    SubmitterSettings,
    WatcherSettings,
)

PREFIX = "TRIALBUS_"
SERVICE_SETTINGS: tuple[type[CommonSettings], ...] = (
    RunnerSettings,
    ImporterSettings,
    WatcherSettings,
    SubmitterSettings,
)

STACK_OWNED: Mapping[str, str] = {
    "NATS_URL": "the stack runs its own nats-server",
    "LEDGER_URL": "the stack runs its own ledger",
    "TRIALBUS_NATS_URL": "the stack runs its own nats-server",
    "TRIALBUS_LEDGER_URL": "the stack runs its own ledger",
    "TRIALBUS_PREFIX": "the stack names its own streams",
    "TRIALBUS_LEDGER_DB": "the stack names its own ledger database",
    "TRIALBUS_NATS_CREDENTIALS": "each service gets its role's credentials",
    "TRIALBUS_NATS_JS_DOMAIN": "the stack's runners share its own JetStream",
    "TRIALBUS_STREAM_REPLICAS": "the stack's nats-server is a single node",
    "TRIALBUS_JOBS_DIR": "the stack keeps its job folders in its data folder",
    "TRIALBUS_WORK_DIR": "the stack keeps its runners' folders in its data folder",
    "TRIALBUS_SANDBOX_DIR": "the stack keeps its sandboxes in its data folder",
    "TRIALBUS_SANDBOX_HIDE": "the stack hides its data folder from every trial",
    "TRIALBUS_HTTP_PORT": "the stack picks the HTTP port (8080 when free)",
    "TRIALBUS_METRICS_PORT": "one port for the importer, watcher and every runner would "
    "collide: the API serves /metrics on its own port",
    "TRIALBUS_API_TOKENS_FILE": "the stack keeps the API's tokens in its secrets folder",
    "TRIALBUS_CONCURRENCY": "give trialbus up --concurrency",
    "TRIALBUS_RUNNER_ID": "the stack names its runners",
    "TRIALBUS_LOG_JSON": "the stack's service logs are JSON",
}
"""What the stack decides itself, and why a shell's value is not passed."""

CLIENT_ONLY = frozenset({"TRIALBUS_STACK_FILE", "TRIALBUS_API_TOKEN"})
"""Read by the CLI (or once read by it), by no service: neither passed nor warned of."""


def service_setting_names() -> dict[str, bool]:
    """Every environment name a service reads: whether its value is a path (made
    absolute before it is passed)."""
    return {
        f"{PREFIX}{name.upper()}": _is_path(info.annotation)
        for settings in SERVICE_SETTINGS
        for name, info in settings.model_fields.items()
    }


def _is_path(annotation: object) -> bool:
    """``Path`` or ``Path | None``; a list of paths is not (its value is JSON)."""
    if annotation is Path:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return Path in typing.get_args(annotation)
    return False


@dataclass(frozen=True, slots=True)
class ShellSettings:
    """The shell's settings sorted: what is passed, and what is not, with why."""

    passed: dict[str, str]
    owned: dict[str, str]
    """Name: why the stack decides it."""
    unknown: dict[str, str | None]
    """Name: the nearest name a service reads, if one is near."""

    def lines(self) -> list[str]:
        """What the console says of them (nothing when the shell sets none)."""
        out: list[str] = []
        if self.passed:
            out.append(f"settings from this shell, for every service: {', '.join(self.passed)}")
        for name, why in self.owned.items():
            out.append(f"not passed: {name} ({why})")
        for name, near in self.unknown.items():
            hint = f"; did you mean {near}?" if near else ""
            out.append(f"not passed: {name} is no setting of any trialbus service{hint}")
        return out


def shell_settings(environ: Mapping[str, str], cwd: Path) -> ShellSettings:
    """Sort ``environ``'s trialbus settings (see the module's text)."""
    known = service_setting_names()
    # Near names are compared without the prefix, which every name shares.
    real = [k.removeprefix(PREFIX) for k in known if k not in STACK_OWNED]
    passed: dict[str, str] = {}
    owned: dict[str, str] = {}
    unknown: dict[str, str | None] = {}
    for name in sorted(environ):
        value = environ[name]
        if name in STACK_OWNED:
            owned[name] = STACK_OWNED[name]
        elif not name.startswith(PREFIX) or name in CLIENT_ONLY:
            continue
        elif name not in known:
            near = difflib.get_close_matches(name.removeprefix(PREFIX), real, 1)
            unknown[name] = f"{PREFIX}{near[0]}" if near else None
        elif known[name] and value:
            passed[name] = str(cwd / Path(value).expanduser())
        else:
            passed[name] = value
    return ShellSettings(passed, owned, unknown)


def from_this_shell() -> ShellSettings:
    """:func:`shell_settings` of this process's environment and folder."""
    return shell_settings(os.environ, Path.cwd())
