"""Set-up of the runner's trial forkserver: importing this module IS the set-up.

Imported by one process only: the multiprocessing forkserver that
services.runner.isolation starts (``set_forkserver_preload``), before it forks any
trial. Every trial process is a fork of that state, so what happens here is paid once
per runner instead of once per trial, and never on the runner's event loop:

- litellm reads its price list from the package (``LITELLM_LOCAL_MODEL_COST_MAP``)
  instead of downloading it. On a host without network its first import otherwise
  retries the download with sleeps (~7 s), and a stale remote list is not what a
  trial should be priced with anyway. A value the operator set is kept.
- Harbor's trial machinery and the local environment are imported, so a trial starts
  in milliseconds. (services.runner.isolation adds the LLM agent stack, litellm and
  terminus-2, to the preload when the runner's first trial names a model.) So is
  what a trial would otherwise import or build on first use, which a forked child
  pays again every time (``TRIAL_FIRST_USE``): measured on a 2-core machine, a
  trial forked without it spent ~150 ms more CPU (dirhash and scantree, which
  Harbor's Task imports to hash the task folder, were ~250 ms of import wall time
  alone; the seccomp filter is compiled once per process).
- The runner's environment, which the forkserver keeps for its trials (each cuts its
  own down: services.runner.trial_env), leaves the block ``/proc/<pid>/environ``
  shows, where a trial's code could read it in its parent.
- SIGTERM and SIGINT are ignored: the stack signals the runner's whole process group
  when it stops, and the forkserver must outlive the runner's drain (its trials
  report through it). It exits when the runner does (multiprocessing's alive pipe).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal

from services.runner.isolation import incomplete_harbor_models
from services.runner.trial_env import hide_exec_environment

PRELOADED = (
    "harbor.trial.trial",
    "services.localenv.environment",
    "services.runner.trial_process",
)
"""What every trial needs: Harbor's trial machinery, the local environment, the child's code."""

TRIAL_FIRST_USE = (
    # Imported inside functions by Harbor (Task's content hash, the single-step trial,
    # its trajectory sync) and by the local environment (its seccomp filter).
    "harbor.trial.single_step",
    "harbor.trial.sync_trajectory",
    "dirhash",
    "scantree",
    "pyseccomp",
    # Harbor's built-in agents that need no model (the LLM stack has its own preload).
    "harbor.agents.nop",
    "harbor.agents.oracle",
    # asyncio.to_thread's executor and the pools Harbor starts.
    "concurrent.futures.thread",
    "multiprocessing.pool",
)
"""What a trial imports on first use: imported here once instead of in every trial's
process. Optional: one that cannot be imported is left to the trial (which then
reports its own error, as without the preload)."""


def warm_trial_state() -> None:
    """Import ``TRIAL_FIRST_USE``, build the sandbox's seccomp filter (cached per
    process) and Harbor's models left unbuilt at import, so that forked trials
    inherit them."""
    for name in TRIAL_FIRST_USE:
        # OSError, RuntimeError: pyseccomp without libseccomp.so.2 (seccomp.py says so).
        with contextlib.suppress(ImportError, OSError, RuntimeError):
            importlib.import_module(name)
    from services.localenv.errors import LocalEnvironmentError
    from services.localenv.seccomp import filter_program

    # No libseccomp here: each trial reports it, naming the fix, as before.
    with contextlib.suppress(LocalEnvironmentError):
        filter_program()
    for model in incomplete_harbor_models():
        # One whose references still do not resolve stays as it was: built on use.
        with contextlib.suppress(Exception):
            model.model_rebuild()


os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
hide_exec_environment()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)

for _module in PRELOADED:
    importlib.import_module(_module)
warm_trial_state()
