"""The environment a trial's process keeps: an allowlist, never the runner's whole one.

A trial's process is a fork of the runner's forkserver, which started with the
runner's environment: the ledger URL and its password, the NATS credentials file,
cloud credentials, whatever the operator exported. In that process run code the
manifest chose (an agent imported by path, terminus-2's model calls), Harbor's
environments (the docker environment hands ``os.environ`` to ``docker compose``,
which interpolates the task's compose file from it) and a task's ``${NAME}``
templates. So before any of it runs, the process's environment is cut down to:

- what a process needs to work (:data:`BASE_NAMES`, ``LC_*``), and what Harbor's
  docker environment and the local sandbox read (``DOCKER_*`` names listed below,
  ``PYENV_ROOT``);
- the names this trial may be given: its agent's ``api_key_env`` and the names its
  task templates, both already checked against the runner policy's secret names;
- the names the runner operator lists in the policy's ``pass_env``.

Everything else is removed, from ``os.environ`` (what Harbor, agents and child
programs read) and from the process's original environment block (what
``/proc/self/environ`` shows: the forkserver's exec-time environment, which a fork
keeps; ``os.environ.clear()`` alone leaves it readable). The forkserver hides its own
block when it starts (:func:`hide_exec_environment`), so a trial does not find the
runner's environment in ``/proc/<its parent>/environ`` either.

The runner itself keeps its environment: the redaction of a trial's secrets
(services.common.redaction.TrialSecrets) reads them there.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

BASE_NAMES = frozenset(
    {
        # What programs need to run as the runner's user.
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TMP",
        "TEMP",
        "PWD",
        "XDG_RUNTIME_DIR",  # rootless Docker's socket
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        # Which CA certificates TLS clients trust (a model endpoint's).
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        # Harbor's docker environment and the docker CLI it runs.
        "DOCKER_HOST",
        "DOCKER_CONTEXT",
        "DOCKER_CONFIG",
        "DOCKER_CERT_PATH",
        "DOCKER_TLS",
        "DOCKER_TLS_VERIFY",
        "DOCKER_API_VERSION",
        "DOCKER_BUILDKIT",
        "DOCKER_DEFAULT_PLATFORM",
        "BUILDKIT_PROGRESS",
        # The local sandbox's interpreters (services.localenv.images).
        "PYENV_ROOT",
        # Harbor's telemetry switch (an operator who turned it off keeps it off), and
        # litellm's local price list (services.runner.forkserver_preload sets it).
        "HARBOR_TELEMETRY",
        "LITELLM_LOCAL_MODEL_COST_MAP",
    }
)
"""Names every trial's process keeps: none holds a secret of the runner's."""
BASE_PREFIXES = ("LC_",)
"""Name prefixes every trial's process keeps (the locale)."""


def kept_names(
    environ: Mapping[str, str], grant: Iterable[str], pass_env: Iterable[str] = ()
) -> list[str]:
    """Names of ``environ`` a trial keeps: the base list, ``grant`` (the trial's
    secret names, checked by the policy) and ``pass_env`` (the operator's)."""
    wanted = {*BASE_NAMES, *grant, *pass_env}
    return sorted(n for n in environ if n in wanted or n.startswith(BASE_PREFIXES))


def trial_environ(
    environ: Mapping[str, str], grant: Iterable[str], pass_env: Iterable[str] = ()
) -> dict[str, str]:
    """The part of ``environ`` a trial's process keeps (see :func:`kept_names`)."""
    return {n: environ[n] for n in kept_names(environ, grant, pass_env)}


def restrict_environ(
    grant: Iterable[str],
    pass_env: Iterable[str] = (),
    environ: MutableMapping[str, str] | None = None,
) -> list[str]:
    """Cut this process's environment down to what a trial keeps; returns the names
    removed. Call it in the trial's process only, before Harbor runs (it changes
    ``os.environ`` and wipes the exec-time environment block)."""
    env = os.environ if environ is None else environ
    keep = trial_environ(env, grant, pass_env)
    removed = sorted(set(env) - set(keep))
    # Every variable is unset (the C environment no longer points into the original
    # block), then the kept ones are set again as fresh copies.
    env.clear()
    env.update(keep)
    if environ is None:
        wipe_exec_environment(set(keep))
    return removed


def hide_exec_environment() -> bool:
    """Keep ``os.environ`` as it is, but no longer in the block ``/proc/<pid>/environ``
    shows (the forkserver's set-up: a trial could read its parent's block there).
    True when the block is empty."""
    values = dict(os.environ)
    os.environ.clear()  # unset: the C environment stops pointing into the block
    os.environ.update(values)  # set again, as copies outside it
    return wipe_exec_environment(set())


def wipe_exec_environment(keep: set[str]) -> bool:
    """Zero every variable but ``keep`` in the environment block this process (or the
    one it is a fork of) was started with, so ``/proc/self/environ`` no longer shows
    them. True when no other variable is left there.

    Call it after ``os.environ`` was cleared and refilled: no C pointer then leads to a
    removed variable. Kept variables stay where they are (a library that kept a
    pointer to one still reads it). The block is written only if it holds what the
    kernel says it holds (``/proc/self/environ``), so a wrong address is never written.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        # Fields 50 and 51 of stat (env_start, env_end); index 0 here is field 3.
        start, end = int(fields[47]), int(fields[48])
        shown = Path("/proc/self/environ").read_bytes()
    except (OSError, IndexError, ValueError):
        return False
    if end - start != len(shown) or ctypes.string_at(start, len(shown)) != shown:
        return False
    offset = 0
    for entry in shown.split(b"\0"):
        name = entry.split(b"=", 1)[0].decode(errors="replace")
        if entry and name not in keep:
            ctypes.memset(start + offset, 0, len(entry))
        offset += len(entry) + 1
    left = Path("/proc/self/environ").read_bytes().split(b"\0")
    return all(e.split(b"=", 1)[0].decode(errors="replace") in keep for e in left if e)
